"""enable_request_metrics: a `metrics` object in every response body and final stream event of
/v1/completions, /v1/chat/completions, /v1/responses and /v1/messages, whose seconds are the
engine's own record of the request (the RequestStats the histograms, spans and rows read); off
(the default), no body has one."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.engine.stats import RequestStats
from runtime.engine.timings import RequestMetrics
from tests.runtime.engine.support import RecordingSink
from tests.runtime.server.inprocess import AUTH, InProcess, in_process, llama_and_bert
from tests.runtime.server.live import light_settings

KEYS = set(RequestMetrics.__dataclass_fields__)
CHAT = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/completions": {"model": "llama", "prompt": "Hello there", "max_tokens": 6},
    "/v1/chat/completions": CHAT,
    "/v1/responses": {"model": "llama", "input": "hi", "max_output_tokens": 6},
    "/v1/messages": CHAT,
}
# the engine request id of each endpoint's response id
ENGINE_ID: dict[str, Callable[[str], str]] = {
    "/v1/completions": lambda rid: rid,
    "/v1/chat/completions": lambda rid: rid,
    "/v1/responses": lambda rid: rid,
    "/v1/messages": lambda rid: "msg-" + rid.removeprefix("msg_"),
}


@pytest.fixture(scope="module")
def app(demo_model_dir: Callable[[str], Path]) -> Iterator[tuple[InProcess, RecordingSink]]:
    settings = light_settings(enable_request_metrics=True)
    with in_process(settings, llama_and_bert(demo_model_dir)) as app:
        sink = RecordingSink()
        app.state.stats.add(sink)
        yield app, sink


def _record(sink: RecordingSink, request_id: str) -> RequestStats:
    deadline = time.monotonic() + 30
    while request_id not in sink.by_id():
        assert time.monotonic() < deadline, f"no record of {request_id}"
        time.sleep(0.02)
    return sink.by_id()[request_id]


def _check(metrics: dict[str, Any], record: RequestStats) -> None:
    assert set(metrics) == KEYS
    # the same timestamps as the sinks': the same numbers, not a second clock's
    assert metrics["ttft_seconds"] == record.ttft_seconds
    assert metrics["queue_seconds"] == record.queue_seconds
    assert metrics["e2e_seconds"] == record.e2e_seconds
    assert metrics["mean_itl_seconds"] == record.tpot_seconds
    assert metrics["prompt_tokens"] == record.prompt_tokens
    assert metrics["completion_tokens"] == record.completion_tokens
    assert metrics["cached_prompt_tokens"] == record.cached_tokens
    parts = metrics["queue_seconds"] + metrics["prefill_seconds"] + metrics["decode_seconds"]
    assert parts == pytest.approx(metrics["e2e_seconds"])
    assert metrics["decode_tokens_per_second"] > 0


@pytest.mark.parametrize("path", list(BODIES))
def test_a_body_carries_the_engines_timings(
    app: tuple[InProcess, RecordingSink], path: str
) -> None:
    server, sink = app
    body = {**BODIES[path], "temperature": 0}
    response = server.client.post(path, json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    payload = response.json()
    record = _record(sink, ENGINE_ID[path](payload["id"]))
    _check(payload["metrics"], record)


def _events(server: InProcess, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with server.client.stream("POST", path, json=body, headers=AUTH) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    return [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]


def _metrics_of(event: dict[str, Any]) -> dict[str, Any] | None:
    """An event's `metrics`: the Responses API's sit in its response object."""
    return event.get("metrics", event.get("response", {}).get("metrics"))


# stream_options.include_usage (completions and chat): its usage chunk is the last one
STREAMS = [(path, False) for path in BODIES] + [
    ("/v1/completions", True),
    ("/v1/chat/completions", True),
]


@pytest.mark.parametrize(("path", "include_usage"), STREAMS)
def test_the_final_stream_event_carries_them(
    app: tuple[InProcess, RecordingSink], path: str, include_usage: bool
) -> None:
    server, sink = app
    body = {**BODIES[path], "temperature": 0, "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    events = _events(server, path, body)
    with_metrics = [i for i, event in enumerate(events) if _metrics_of(event) is not None]
    assert with_metrics == [len(events) - 1]  # the last event only
    final = events[-1]
    if path == "/v1/responses":
        assert final["type"] in ("response.completed", "response.incomplete")
        rid = final["response"]["id"]
    elif path == "/v1/messages":
        assert final["type"] == "message_stop"
        rid = events[0]["message"]["id"]
    else:
        rid = final["id"]
        assert ("usage" in final) is include_usage
    metrics = _metrics_of(final)
    assert metrics is not None
    _check(metrics, _record(sink, ENGINE_ID[path](rid)))


def test_several_choices_report_the_requests_timings(
    app: tuple[InProcess, RecordingSink],
) -> None:
    server, sink = app
    body = {**CHAT, "n": 3, "temperature": 0.8, "seed": 1}
    response = server.client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    payload = response.json()
    record = _record(sink, payload["id"])
    _check(payload["metrics"], record)
    assert payload["metrics"]["completion_tokens"] == payload["usage"]["completion_tokens"]


def test_off_by_default_no_body_has_metrics(demo_model_dir: Callable[[str], Path]) -> None:
    with in_process(light_settings(), llama_and_bert(demo_model_dir)) as server:
        for path, body in BODIES.items():
            response = server.client.post(path, json=body, headers=AUTH)
            assert response.status_code == 200, response.text
            assert "metrics" not in response.json()
            events = _events(server, path, {**body, "stream": True})
            assert all(_metrics_of(event) is None for event in events)


def test_a_streamed_tool_call_carries_them(app: tuple[InProcess, RecordingSink]) -> None:
    server, sink = app
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
    }
    body = {
        **CHAT,
        "stream": True,
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    }
    events = _events(server, "/v1/chat/completions", body)
    assert [i for i, e in enumerate(events) if "metrics" in e] == [len(events) - 1]
    _check(events[-1]["metrics"], _record(sink, events[-1]["id"]))


def test_several_streamed_choices_carry_them_once(app: tuple[InProcess, RecordingSink]) -> None:
    server, sink = app
    body = {**CHAT, "n": 2, "temperature": 0.8, "seed": 1, "stream": True}
    events = _events(server, "/v1/chat/completions", body)
    carrying = [e for e in events if "metrics" in e]
    assert len(carrying) == 1 and carrying[0]["choices"][0]["finish_reason"] is not None
    _check(carrying[0]["metrics"], _record(sink, events[0]["id"]))
