"""The streamed response's events without a server: outputs pushed into a handle by hand, every
event validated against the `openai` SDK's own `ResponseStreamEvent` union (not constructed), the
held-back tool call text, parallel_tool_calls, and a failure after the stream began."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from runtime.engine.request import RequestHandle, TokenOutput
from runtime.engine.stats import FinishReason
from runtime.errors import FastllmError, RequestTimeout
from runtime.server.responses.events import response_events
from runtime.server.responses.objects import Draft
from runtime.server.responses.schemas import ResponsesRequest
from runtime.server.responses.tools import response_tools

EVENT = TypeAdapter(ResponseStreamEvent)
ADD = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOLS = [{"type": "function", "name": "add", "parameters": ADD, "strict": False}]


def run(
    pieces: list[str],
    reason: FinishReason | None = FinishReason.STOP,
    error: FastllmError | None = None,
    **fields: Any,
) -> list[Any]:
    body = ResponsesRequest.model_validate({"model": "m", "input": "hi", **fields})
    draft = Draft("resp_1", 0, "m", body, response_tools(body))
    handle = RequestHandle("resp_1")
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        output = TokenOutput("resp_1", [i], piece, reason if last else None, 3, i + 1)
        if last:
            output.error = error
        handle.push(output)

    async def collect() -> list[bytes]:
        return [e async for e in response_events(handle, lambda: None, draft, None)]

    events = []
    for raw in asyncio.run(collect()):
        name, data = raw.decode().removesuffix("\n\n").split("\n")
        event = EVENT.validate_json(data.removeprefix("data: "))
        assert name == f"event: {event.type}"
        events.append(event)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def test_text_then_a_call_in_auto_mode() -> None:
    pieces = ["Sure", " <tool", '_call>{"name": "add", ', '"arguments": {"a": 7}}</tool_call>']
    events = run(pieces, tools=TOOLS)
    final = events[-1].response
    assert events[-1].type == "response.completed" and final.usage.output_tokens == 4
    message, call = final.output
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == message.content[0].text == "Sure "  # "<tool" was held back, never text
    assert call.type == "function_call" and json.loads(call.arguments) == {"a": 7}
    arguments = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert [e.delta for e in arguments] == [call.arguments]


def test_blank_text_before_a_call_makes_no_message() -> None:
    call = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    events = run(["\n ", call, call], tools=TOOLS)
    kinds = {e.type for e in events}
    assert "response.output_text.delta" not in kinds
    assert [i.type for i in events[-1].response.output] == ["function_call", "function_call"]
    one = run(["\n ", call, call], tools=TOOLS, parallel_tool_calls=False)
    assert [i.type for i in one[-1].response.output] == ["function_call"]
    assert one[-1].response.parallel_tool_calls is False


def test_text_that_only_looked_like_a_call_goes_out_as_text() -> None:
    pieces = ["a <tool_", "call> not json", "</tool_call>"]
    events = run(pieces, tools=TOOLS)
    (message,) = events[-1].response.output
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == message.content[0].text == "".join(pieces)


def test_a_cut_short_forced_call_is_incomplete() -> None:
    choice = {"type": "function", "name": "add"}
    events = run(['{"a": ', "12"], FinishReason.LENGTH, tools=TOOLS, tool_choice=choice)
    assert events[-1].type == "response.incomplete"
    final = events[-1].response
    assert final.incomplete_details.reason == "max_output_tokens"
    (call,) = final.output
    assert call.status == "incomplete" and call.arguments == '{"a": 12'


def test_a_failure_after_the_stream_began_is_response_failed() -> None:
    events = run(["Hel", "lo"], None, error=RequestTimeout("the request ran past its deadline"))
    assert events[-1].type == "response.failed"
    final = events[-1].response
    assert final.status == "failed" and final.error.code == "server_error"
    assert "deadline" in final.error.message
    # what was generated before the failure still went out
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello"
