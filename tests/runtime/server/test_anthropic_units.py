"""Messages API pieces without a server: a tool schema loosened only as far as the grammar engine
needs (jsonschema says the loosened schema still accepts what the original does), the key an
`x-api-key` stands for (hence the tenant), and the error statuses."""

from __future__ import annotations

import jsonschema
import pytest

from runtime.server.anthropic.auth import authorization_of
from runtime.server.anthropic.errors import anthropic_error, is_messages_path
from runtime.server.anthropic.fit_schema import ANY_OBJECT, fit_schema, is_grammar_ready
from runtime.server.openai.tenancy import tenant_of

TAKEN = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {"a": {"type": "string", "pattern": "^[a-z]+$", "format": "email"}},
}
REFUSED = {
    "type": "object",
    "properties": {
        # properties named like keywords: names, not keywords, so they stay
        "pattern": {"type": "string", "pattern": "(?<=a)b"},
        "format": {"enum": []},
        "count": {"type": "integer", "minimum": 1},
    },
    "required": ["pattern", "count"],
}


def test_a_schema_the_grammar_takes_is_kept() -> None:
    assert fit_schema(TAKEN) is TAKEN
    assert fit_schema(None) == ANY_OBJECT == fit_schema({})


def test_a_refused_schema_is_loosened_not_dropped() -> None:
    assert not is_grammar_ready(REFUSED)
    loose = fit_schema(REFUSED)
    assert is_grammar_ready(loose)
    assert set(loose["properties"]) == {"pattern", "format", "count"}
    assert loose["required"] == ["pattern", "count"]
    assert loose["properties"]["pattern"] == {"type": "string"}
    # what the original accepts, the loosened one accepts
    jsonschema.validate({"pattern": "ab", "count": 2}, REFUSED)
    jsonschema.validate({"pattern": "ab", "count": 2}, loose)
    assert fit_schema({"type": "object", "properties": {"a": {"type": "banana"}}}) != ANY_OBJECT


def test_x_api_key_names_the_same_tenant_on_the_messages_routes_only() -> None:
    keys = ["sk-a", "sk-b"]
    assert tenant_of(authorization_of("/v1/messages", None, "sk-b"), keys) == "key-2"
    assert tenant_of(authorization_of("/v1/messages", "Bearer sk-a", None), keys) == "key-1"
    assert authorization_of("/v1/messages/count_tokens", "Bearer sk-a", "sk-b") == "Bearer sk-b"
    assert authorization_of("/v1/chat/completions", None, "sk-b") is None
    assert not is_messages_path("/v1/messagesx") and is_messages_path("/v1/messages/count_tokens")


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, (400, "invalid_request_error")),
        (401, (401, "authentication_error")),
        (404, (404, "not_found_error")),
        (413, (413, "request_too_large")),
        (429, (529, "overloaded_error")),
        (503, (529, "overloaded_error")),
        (500, (500, "api_error")),
        (504, (504, "timeout_error")),
    ],
)
def test_statuses_map_to_anthropic_types(status: int, expected: tuple[int, str]) -> None:
    new_status, body = anthropic_error(status, "why")
    assert (new_status, body["error"]["type"]) == expected
    assert body == {"type": "error", "error": {"type": expected[1], "message": "why"}}
