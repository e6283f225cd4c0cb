"""/v1/messages under bad input and its observation, in-process with the inference_log on: every
hostile body is a 4xx in Anthropic's own error shape (never a 500, never OpenAI's shape), the
OpenAI routes keep theirs, and a message is seen like a chat request: its span's
gen_ai.operation.name, its inference_log row, its failure counted."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.server.inprocess import (
    InProcess,
    in_process,
    llama_and_bert,
    storage_settings,
)
from tests.runtime.server.live import API_KEY

KEY = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01", "anthropic-beta": "no-such-beta"}
HELLO = [{"role": "user", "content": "hello"}]
BASE: dict[str, Any] = {"model": "llama", "max_tokens": 4, "messages": HELLO}
TOOL = {"name": "add", "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}


@pytest.fixture(scope="module")
def app(
    demo_model_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcess]:
    settings = storage_settings(tmp_path_factory.mktemp("anthropic"))
    with in_process(settings, llama_and_bert(demo_model_dir)) as served:
        yield served


def assert_anthropic_error(response: Any, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == error_type
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return str(body["error"]["message"])


def user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


TEXT = {"type": "text", "text": "hi"}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1}}
HOSTILE: dict[str, dict[str, Any]] = {
    "max_tokens a string": {**BASE, "max_tokens": "5"},
    "max_tokens zero": {**BASE, "max_tokens": 0},
    "max_tokens missing": {"model": "llama", "messages": HELLO},
    "messages a string": {**BASE, "messages": "hello"},
    "no messages": {**BASE, "messages": []},
    "a role of its own": {**BASE, "messages": [{"role": "robot", "content": "hi"}]},
    "content a number": {**BASE, "messages": [{"role": "user", "content": 5}]},
    "system a number": {**BASE, "system": 5},
    "unknown block type": {**BASE, "messages": [user({"type": "banana", "text": "hi"})]},
    "image block": {
        **BASE,
        "messages": [user({"type": "image", "source": {"type": "base64", "data": "AA=="}})],
    },
    "image in a tool result": {
        **BASE,
        "messages": [
            user(TEXT),
            {"role": "assistant", "content": [CALL]},
            user({"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "image"}]}),
        ],
    },
    "tool_result naming no tool_use": {
        **BASE,
        "messages": [user({"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"})],
    },
    "tool_result in an assistant turn": {
        **BASE,
        "messages": [
            user(TEXT),
            {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        ],
    },
    "tool_use in a user turn": {**BASE, "messages": [user(CALL)]},
    "tool_use input not an object": {
        **BASE,
        "messages": [
            user(TEXT),
            {"role": "assistant", "content": [{**CALL, "input": [1]}]},
            user(TEXT),
        ],
    },
    "10k tools": {**BASE, "tools": [{**TOOL, "name": f"t{i}"} for i in range(10_000)]},
    "two tools of one name": {**BASE, "tools": [TOOL, TOOL]},
    "a tool name with spaces": {**BASE, "tools": [{**TOOL, "name": "bad name!"}]},
    "tool_choice naming no tool": {
        **BASE,
        "tools": [TOOL],
        "tool_choice": {"type": "tool", "name": "x"},
    },
    "tool_choice any without tools": {**BASE, "tool_choice": {"type": "any"}},
    "tool_choice tool without a name": {**BASE, "tools": [TOOL], "tool_choice": {"type": "tool"}},
    "tool_choice of a type of its own": {**BASE, "tool_choice": {"type": "always"}},
    "temperature above 1": {**BASE, "temperature": 5},
    "top_k negative": {**BASE, "top_k": -1},
    "an empty stop sequence": {**BASE, "stop_sequences": [""]},
    "too many stop sequences": {**BASE, "stop_sequences": [f"s{i}" for i in range(40)]},
    "format with a forced tool": {
        **BASE,
        "tools": [TOOL],
        "tool_choice": {"type": "any"},
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
    },
    "an embedding model": {**BASE, "model": "bert"},
}


@pytest.mark.parametrize("name", list(HOSTILE))
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_hostile_bodies_get_anthropic_4xx(app: InProcess, name: str, path: str) -> None:
    body = HOSTILE[name]
    response = app.client.post(path, json=body, headers=KEY)
    if path.endswith("count_tokens") and response.status_code == 200:
        # count_tokens takes no sampling fields and runs nothing: only the prompt's faults count
        assert name in COUNT_TOLERATES, (name, response.text)
        assert response.json()["input_tokens"] > 0
        return
    assert_anthropic_error(response, 400, "invalid_request_error")


# bodies whose fault is in a field count_tokens does not take (or a model it can still count for)
COUNT_TOLERATES = {
    "max_tokens a string",
    "max_tokens zero",
    "max_tokens missing",
    "temperature above 1",
    "top_k negative",
    "an empty stop sequence",
    "too many stop sequences",
    "an embedding model",
}


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"[1, 2]", b'"text"', b"\xff\xfe", json.dumps({**BASE, "x": "\ud800"}).encode()],
)
def test_bodies_that_are_no_json_object(app: InProcess, raw: bytes) -> None:
    headers = {**KEY, "content-type": "application/json"}
    response = app.client.post("/v1/messages", content=raw, headers=headers)
    assert_anthropic_error(response, 400, "invalid_request_error")


def test_auth_unknown_model_and_routes_in_anthropic_shape(app: InProcess) -> None:
    message = assert_anthropic_error(
        app.client.post("/v1/messages", json=BASE), 401, "authentication_error"
    )
    assert "x-api-key" in message
    bad = {**KEY, "x-api-key": "wrong"}
    assert_anthropic_error(
        app.client.post("/v1/messages", json=BASE, headers=bad), 401, "authentication_error"
    )
    unknown = {**BASE, "model": "claude-opus-4-5"}
    assert_anthropic_error(
        app.client.post("/v1/messages", json=unknown, headers=KEY), 404, "not_found_error"
    )
    assert_anthropic_error(
        app.client.get("/v1/messages", headers=KEY), 405, "invalid_request_error"
    )
    assert_anthropic_error(
        app.client.post("/v1/messages/nope", json=BASE, headers=KEY), 404, "not_found_error"
    )
    # the OpenAI routes keep OpenAI's shape, and x-api-key is no key there
    chat = app.client.post(
        "/v1/chat/completions",
        json={**BASE, "max_tokens": "5"},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert chat.status_code == 400 and set(chat.json()) == {"error"}
    assert app.client.post("/v1/chat/completions", json=BASE, headers=KEY).status_code == 401


def test_ignored_fields_and_loosened_schemas_are_accepted(app: InProcess) -> None:
    body = {
        **BASE,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "user_abc_account__session_1"},
        "service_tier": "auto",
        "cache_control": {"type": "ephemeral"},
        "tools": [
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 1},
            {
                "name": "grep",
                "input_schema": {  # a lookbehind XGrammar refuses, an empty enum: loosened
                    "$schema": "https://json-schema.org/draft/2020-12/schema",
                    "type": "object",
                    "properties": {
                        "pattern": {"type": "string", "pattern": "(?<=a)b", "maxLength": 4},
                        "mode": {"enum": []},
                    },
                    "required": ["pattern"],
                    "additionalProperties": False,
                },
            },
        ],
        "tool_choice": {"type": "tool", "name": "grep", "disable_parallel_tool_use": True},
        "max_tokens": 40,
    }
    response = app.client.post("/v1/messages?beta=true", json=body, headers=KEY)
    assert response.status_code == 200, response.text
    message = response.json()
    assert [b["type"] for b in message["content"]] in (["tool_use"], ["text"])
    if message["stop_reason"] == "tool_use":
        assert message["content"][0]["name"] == "grep"
        assert isinstance(message["content"][0]["input"]["pattern"], str)


def test_a_message_is_observed_as_a_request(app: InProcess) -> None:
    state = app.state
    seen: list[dict[str, Any]] = []
    original = state.start_span
    assert original is not None

    def recording(request_id: str, traceparent: str | None, attributes: dict[str, Any]) -> Any:
        seen.append({"id": request_id, **attributes})
        return original(request_id, traceparent, attributes)

    state.start_span = recording
    try:
        made = app.client.post("/v1/messages", json=BASE, headers=KEY)
        streamed = app.client.post("/v1/messages", json={**BASE, "stream": True}, headers=KEY)
    finally:
        state.start_span = original
    assert made.status_code == streamed.status_code == 200
    assert [s["gen_ai.operation.name"] for s in seen] == ["messages", "messages"]
    ids = [made.json()["id"], _stream_id(streamed.text)]
    assert [s["id"] for s in seen] == [f"msg-{i.removeprefix('msg_')}" for i in ids]
    failures = app.failures("validation")
    bad = app.client.post("/v1/messages", json={**BASE, "max_tokens": "5"}, headers=KEY)
    assert bad.status_code == 400 and app.failures("validation") == failures + 1
    app.barrier_rows()
    assert app.db is not None
    with sqlite3.connect(app.db) as conn:
        rows = conn.execute(
            "SELECT request_id, status, prompt_tokens, completion_tokens FROM inference_log "
            "WHERE request_id IN (?, ?)",
            [s["id"] for s in seen],
        ).fetchall()
    assert sorted(r[0] for r in rows) == sorted(s["id"] for s in seen)
    assert all(r[2] > 0 and r[3] >= 1 for r in rows)


def _stream_id(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("data: ") and '"message_start"' in line:
            return str(json.loads(line[6:])["message"]["id"])
    raise AssertionError("no message_start")


def test_stream_sends_a_ping_and_named_events(app: InProcess) -> None:
    response = app.client.post("/v1/messages", json={**BASE, "stream": True}, headers=KEY)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [block.split("\n") for block in response.text.strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in events]
    payloads = [json.loads(lines[1].removeprefix("data: ")) for lines in events]
    assert [p["type"] for p in payloads] == names
    assert names[:2] == ["message_start", "ping"] and names[-2:] == [
        "message_delta",
        "message_stop",
    ]
    usage = payloads[-2]["usage"]
    start = payloads[0]["message"]["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == start["input_tokens"]
