"""Issue 17's findings at the HTTP edge, one regression test each (in-process app, tiny models,
inference_log on SQLite): lone surrogates, a bad request's row, unauthenticated requests, the
Allow header, telling messages, deep JSON, and the OpenAI fields this server does not implement."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.server.inprocess import (
    AUTH,
    InProcess,
    in_process,
    llama_and_bert,
    storage_settings,
)

CHAT = {"model": "llama", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "llama", "prompt": "hi", "max_tokens": 2}
EMBEDDING = {"model": "bert", "input": "hi"}


@pytest.fixture(scope="module")
def app(
    demo_model_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcess]:
    settings = storage_settings(tmp_path_factory.mktemp("hardening"))
    with in_process(settings, llama_and_bert(demo_model_dir)) as served:
        yield served


def post(app: InProcess, path: str, body: Any, **kwargs: Any) -> Any:
    headers = {**AUTH, "Content-Type": "application/json", **kwargs.pop("headers", {})}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return app.client.post(path, content=content, headers=headers, **kwargs)


def assert_error(response: Any, status: int, *, param: str | None = None, needle: str = "") -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and needle in error["message"], error


# --- finding 1: a lone surrogate reached the tokenizer (500) -------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_lone_surrogate_in_chat_content_is_a_400_naming_the_field(
    app: InProcess, stream: bool
) -> None:
    raw = b'{"model": "llama", "stream": %s, "messages": [{"role": "user", "content": "\\ud800"}]}'
    response = post(app, "/v1/chat/completions", raw % (b"true" if stream else b"false"))
    assert_error(response, 400, param="messages", needle="messages.0.content")


def test_a_valid_surrogate_pair_is_text(app: InProcess) -> None:
    content = b'"\\ud83d\\ude00"'  # an emoji, escaped as JSON encoders do
    raw = b'{"model": "llama", "max_tokens": 2, "messages": [{"role": "user", "content": %s}]}'
    raw %= content
    assert post(app, "/v1/chat/completions", raw).status_code == 200


# --- finding 2: the failure record of a bad request took other rows with it ----------------------
def test_a_lone_surrogate_in_model_costs_no_other_row(app: InProcess) -> None:
    before = app.barrier_rows()
    dropped = app.state.writer.num_dropped
    for i in range(20):
        assert post(app, "/v1/completions", COMPLETION).status_code == 200
        if i == 10:
            bad = post(app, "/v1/completions", b'{"model": "\\ud800", "prompt": "x"}')
            assert_error(bad, 400, param="model", needle="model")
    assert app.rows(before + 21) == before + 21  # 20 completions and the refused one's own row
    assert app.state.writer.num_dropped == dropped == 0


# --- finding 7: requests without a key wrote rows; bad JSON was answered before the key -----------
@pytest.mark.parametrize("auth", [{}, {"Authorization": "Bearer wrong"}], ids=["none", "wrong"])
def test_unauthenticated_requests_are_counted_but_write_no_row(
    app: InProcess, auth: dict[str, str]
) -> None:
    before, refused = app.barrier_rows(), app.failures("unauthorized")
    bodies: list[bytes] = [json.dumps(COMPLETION).encode(), b'{"model": ', b"x" * (2 << 20)]
    bodies += [json.dumps(CHAT).encode(), b'{"model": "\\ud800"}', b"[" * 10_000]
    for body in bodies * 3 + bodies[:3]:  # 21 requests
        headers = {"Content-Type": "application/json", **auth}
        response = app.client.post("/v1/completions", content=body, headers=headers)
        assert response.status_code == 401, response.text
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response.headers["www-authenticate"] == "Bearer"
    assert app.failures("unauthorized") == refused + 21
    assert app.barrier_rows() == before + 1  # only the barrier's own


# --- finding 8: the smaller ones ---------------------------------------------------------------
def test_405_names_every_method_of_the_path(app: InProcess) -> None:
    response = app.client.request("OPTIONS", "/admin/rollout")
    assert response.status_code == 405
    assert {m.strip() for m in response.headers["allow"].split(",")} >= {"GET", "POST"}
    assert_error(app.client.request("PUT", "/v1/completions", headers=AUTH), 405)


@pytest.mark.parametrize(
    ("path", "body", "param", "needle"),
    [
        ("/v1/completions", {**COMPLETION, "stop": ["x"] * 1000}, "stop", "at most 4 items"),
        ("/v1/completions", {**COMPLETION, "prompt": [-1]}, "prompt", "greater than or equal to 0"),
        ("/v1/completions", {**COMPLETION, "prompt": [2**31]}, "prompt", "less than or equal to"),
        ("/v1/completions", {**COMPLETION, "prompt": [[3, -1]]}, "prompt", "prompt.0.1"),
        ("/v1/embeddings", {**EMBEDDING, "input": ["x"] * 257}, "input", "at most 256 items"),
    ],
)
def test_list_errors_say_what_is_wrong(
    app: InProcess, path: str, body: dict[str, Any], param: str, needle: str
) -> None:
    response = post(app, path, body)
    assert_error(response, 400, param=param, needle=needle)
    assert "valid string" not in response.json()["error"]["message"]


def test_deep_json_is_a_counted_400_with_its_row(app: InProcess) -> None:
    before, invalid = app.barrier_rows(), app.failures("validation")
    for depth in (10_000, 200):  # beyond the JSON parser's stack, and within it
        body = b'{"model": "llama", "prompt": ' + b"[" * depth + b"]" * depth + b"}"
        response = post(app, "/v1/completions", body)
        assert response.status_code == 400 and set(response.json()["error"]) >= {"message"}
    nested = b'["\\ud83d\\ude00"]'  # text with escapes is walked: depth is checked there too
    for _ in range(99):
        nested = b'["\\ud83d\\ude00", ' + nested + b"]"
    deep_text = b'{"model": "llama", "prompt": ' + nested + b"}"
    assert_error(post(app, "/v1/completions", deep_text), 400, needle="nests deeper")
    assert app.failures("validation") == invalid + 3
    assert app.rows(before + 3) == before + 3


@pytest.mark.parametrize(
    ("path", "base", "field", "value"),
    [
        ("/v1/completions", COMPLETION, "suffix", "tail"),
        ("/v1/chat/completions", CHAT, "functions", [{"name": "f"}]),
        ("/v1/chat/completions", CHAT, "function_call", "auto"),
        ("/v1/embeddings", EMBEDDING, "dimensions", 8),
    ],
)
def test_unsupported_openai_fields_are_refused_by_name(
    app: InProcess, path: str, base: dict[str, Any], field: str, value: Any
) -> None:
    response = post(app, path, {**base, field: value})
    assert_error(response, 400, param=field, needle=f"{field} is not supported")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {**COMPLETION, "echo": False, "best_of": 1, "suffix": ""}),
        ("/v1/chat/completions", {**CHAT, "logprobs": False, "tools": [], "tool_choice": "none"}),
        ("/v1/chat/completions", {**CHAT, "response_format": {"type": "text"}}),
        ("/v1/embeddings", {**EMBEDDING, "dimensions": None}),
    ],
)
def test_neutral_values_of_those_fields_pass(app: InProcess, path: str, body: Any) -> None:
    assert post(app, path, body).status_code == 200
