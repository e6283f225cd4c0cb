"""Streamed /v1/responses through the official `openai` SDK (`responses.create(stream=True)` and
`responses.stream`): every event sequence is checked against its own final response object
(numbers strictly increasing, deltas joining exactly to the done events and the final items), and
a client that leaves mid-stream cancels its engine request (recorded as operation `responses`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.runtime.engine.support import RecordingSink
from tests.runtime.server.live import API_KEY, LiveServer
from tests.runtime.server.test_responses_api import TOOL, WEATHER


class Flag(BaseModel):
    ok: bool
    level: int = Field(ge=-3, le=3)


@pytest.fixture
def client(served: LiveServer) -> Iterator[openai.OpenAI]:
    url = f"{served.url}/v1"
    with openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=60) as client:
        yield client


def _plain(item: Any) -> dict[str, Any]:
    """An item as sent (`responses.stream` adds `parsed` to the final object's text parts)."""
    data = item.model_dump()
    for part in data.get("content") or ():
        part.pop("parsed", None)
    return data


def check_events(events: list[Any]) -> Any:
    """The stream's own consistency; returns its final response."""
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(numbers))), numbers
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds[-1]
    assert kinds.count(kinds[-1]) == 1
    final = events[-1].response
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert final.status == kinds[-1].removeprefix("response.")
    done_items = [e.item for e in events if e.type == "response.output_item.done"]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.output_index for e in added] == list(range(len(final.output)))
    assert [_plain(i) for i in done_items] == [_plain(i) for i in final.output]
    for index, item in enumerate(final.output):
        mine = [e for e in events if getattr(e, "output_index", None) == index]
        assert mine[0].type == "response.output_item.added" and mine[0].item.id == item.id
        assert mine[-1].type == "response.output_item.done"
        assert all(getattr(e, "item_id", item.id) == item.id for e in mine)
        if item.type == "message":
            deltas = "".join(e.delta for e in mine if e.type == "response.output_text.delta")
            (done,) = [e for e in mine if e.type == "response.output_text.done"]
            (part,) = [e for e in mine if e.type == "response.content_part.done"]
            assert deltas == done.text == part.part.text == item.content[0].text
            order = [e.type.removeprefix("response.") for e in mine if "delta" not in e.type]
            assert order == [
                "output_item.added",
                "content_part.added",
                "output_text.done",
                "content_part.done",
                "output_item.done",
            ]
        else:
            args = [e for e in mine if e.type == "response.function_call_arguments.delta"]
            (done,) = [e for e in mine if e.type == "response.function_call_arguments.done"]
            assert "".join(e.delta for e in args) == done.arguments == item.arguments
    return final


def collect(stream: Any) -> list[Any]:
    with stream:
        return list(stream)


def test_streamed_text_joins_to_the_final_object_and_matches_the_joined_one(
    client: openai.OpenAI,
) -> None:
    args: dict[str, Any] = {"model": "llama", "input": "Hello", "temperature": 0}
    final = check_events(
        collect(client.responses.create(stream=True, max_output_tokens=12, **args))
    )
    joined = client.responses.create(max_output_tokens=12, **args)
    assert final.output_text == joined.output_text
    assert final.usage is not None and joined.usage is not None
    assert final.usage.output_tokens == joined.usage.output_tokens
    assert final.usage.input_tokens == joined.usage.input_tokens


def test_streamed_logprobs_join_to_the_final_ones(client: openai.OpenAI) -> None:
    events = collect(
        client.responses.create(
            model="llama", input="Hi", max_output_tokens=8, top_logprobs=1, stream=True
        )
    )
    final = check_events(events)
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    part = final.output[0].content[0]
    assert part.logprobs is not None and len(part.logprobs) == final.usage.output_tokens
    assert [lp.model_dump() for lp in streamed] == [lp.model_dump() for lp in part.logprobs]


def test_incomplete_stream_ends_with_response_incomplete(client: openai.OpenAI) -> None:
    events = collect(
        client.responses.create(
            model="llama", input="Count", max_output_tokens=2, temperature=0, stream=True
        )
    )
    final = check_events(events)
    if final.usage.output_tokens == 2:  # greedy on random weights; an early stop is complete
        assert events[-1].type == "response.incomplete"
        assert final.incomplete_details.reason == "max_output_tokens"


def test_forced_call_streams_its_arguments(client: openai.OpenAI) -> None:
    events = collect(
        client.responses.create(
            model="llama",
            input="Weather?",
            tools=[TOOL],
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=60,
            stream=True,
        )
    )
    final = check_events(events)
    (call,) = final.output
    assert call.type == "function_call" and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert sum(e.type == "response.function_call_arguments.delta" for e in events) >= 1


def test_required_call_streams_as_one_call(client: openai.OpenAI) -> None:
    events = collect(
        client.responses.create(
            model="llama",
            input="Weather?",
            tools=[TOOL],
            tool_choice="required",
            max_output_tokens=80,
            stream=True,
        )
    )
    final = check_events(events)
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_auto_tools_stream_is_consistent(client: openai.OpenAI) -> None:
    for _ in range(3):  # text or calls, whatever the weights say: the stream agrees with itself
        check_events(
            collect(
                client.responses.create(
                    model="llama", input="Hm", tools=[TOOL], max_output_tokens=10, stream=True
                )
            )
        )


def test_stream_helper_parses_the_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="llama", input="Flag it", text_format=Flag, max_output_tokens=100
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    check_events(events)
    assert isinstance(final.output_parsed, Flag)


def test_raw_events_name_their_type(served: LiveServer) -> None:
    body = {"model": "llama", "input": "Hi", "max_output_tokens": 3, "stream": True}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.stream(
        "POST", f"{served.url}/v1/responses", json=body, headers=headers, timeout=60
    ) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        blocks = reply.read().decode().strip().split("\n\n")
    for block in blocks:
        event, data = block.split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[len("data: ") :])["type"] == event[len("event: ") :]


async def _drop_after_a_delta(url: str) -> str:
    # a string of at least 3000 characters cannot end within 1500 tokens (the grammar masks the
    # end of text), so the request is still running when the client leaves
    long_text = {
        "type": "json_schema",
        "name": "s",
        "schema": {"type": "string", "minLength": 3000},
    }
    body = {
        "model": "llama",
        "input": "tell me a long story",
        "max_output_tokens": 1500,
        "text": {"format": long_text},
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=60) as client,
        client.stream("POST", url, json=body) as response,
    ):
        assert response.status_code == 200
        events = []
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
            if events and events[-1]["type"] == "response.output_text.delta":
                break
    return str(events[0]["response"]["id"])


def test_a_client_that_leaves_cancels_its_request(served: LiveServer) -> None:
    sink = RecordingSink()
    served.state.stats.add(sink)
    engine = served.state.router.pick("llama").engine
    response_id = asyncio.run(_drop_after_a_delta(f"{served.url}/v1/responses"))
    deadline = time.monotonic() + 60
    while response_id not in sink.by_id():  # the engine's record carries the response's id
        assert time.monotonic() < deadline, "the cancelled request was never reported"
        time.sleep(0.05)
    record = sink.by_id()[response_id]
    assert record.operation == "responses"
    assert record.finished_reason == "cancelled" and record.completion_tokens < 1500
    assert engine.num_running == 0 and engine.num_waiting == 0
