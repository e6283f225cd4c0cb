"""Tool calling pieces without a server: plans and their errors, the prompt rendering, the parse
of a model's tool-call format, and the streamed `delta.tool_calls` chunks (read back with the
official `openai` client's chunk model)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletionChunk

from runtime.engine.request import RequestHandle, TokenOutput
from runtime.engine.stats import FinishReason
from runtime.errors import InvalidRequestError
from runtime.models.tokenizer import Tokenizer
from runtime.server.openai.schemas import ChatCompletionRequest, ChatMessage
from runtime.server.openai.tools import parse_tool_calls, plan_tools, render_chat_prompt
from runtime.server.openai.tools.stream import tool_events

ADD = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "adds", "parameters": ADD}},
    {"type": "function", "function": {"name": "now"}},
]


def body(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_plans_by_tool_choice() -> None:
    assert plan_tools(body()).mode == "none" and not plan_tools(body()).is_offered
    assert plan_tools(body(tools=TOOLS)).mode == "auto"
    assert plan_tools(body(tools=TOOLS, tool_choice="none")).is_offered is False
    named = plan_tools(
        body(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    )
    spec = named.constraint()
    assert named.mode == "named" and spec is not None and json.loads(spec.source) == ADD
    required = plan_tools(body(tools=TOOLS, tool_choice="required")).constraint()
    assert required is not None and required.stats_label == "tools"
    assert [v["properties"]["name"]["const"] for v in json.loads(required.source)["anyOf"]] == [
        "add",
        "now",
    ]
    assert plan_tools(body(tools=TOOLS)).constraint() is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"parameters": ADD}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
        ({"tools": [TOOLS[1], TOOLS[1]]}, "tools"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_bad_tools_are_refused_by_field(fields: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        plan_tools(body(**fields))
    assert err.value.param == param


def test_auto_output_is_parsed_into_calls() -> None:
    plan = plan_tools(body(tools=TOOLS))
    text = (
        'Let me add. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    )
    parsed = parse_tool_calls(plan, text)
    assert parsed.content == "Let me add."
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls
    ] == [("add", {"a": 1}), ("now", {})]
    for text in (
        "plain text",
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "absent", "arguments": {}}</tool_call>',
    ):
        assert (
            parse_tool_calls(plan, text).tool_calls == []
            and parse_tool_calls(plan, text).content == text
        )


def test_prompt_rendering_with_and_without_a_tools_template(demo_tokenizer_dir: Path) -> None:
    tokenizer = Tokenizer.from_dir(demo_tokenizer_dir)
    messages = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="add 1"),
        ChatMessage.model_validate(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 1}'},
                    }
                ],
            }
        ),
        ChatMessage(role="tool", content="2", tool_call_id="c1"),
    ]
    plan = plan_tools(body(tools=TOOLS))
    prompt = render_chat_prompt(tokenizer, messages, plan)
    assert (
        prompt.index("Be brief.")
        < prompt.index("You can call these tools")
        < prompt.index('"name": "add"')
    )
    assert '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>' in prompt
    assert "<|tool|>\n2" in prompt
    none = render_chat_prompt(
        tokenizer, messages, plan_tools(body(tools=TOOLS, tool_choice="none"))
    )
    assert "You can call these tools" not in none
    tokenizer.chat_template = "{% for t in tools %}[{{ t.function.name }}]{% endfor %}"
    assert render_chat_prompt(tokenizer, messages, plan) == "[add][now]"


def stream(plan_fields: dict, pieces: list[str], reason: FinishReason) -> list[ChatCompletionChunk]:
    plan = plan_tools(body(tools=TOOLS, **plan_fields))
    handle = RequestHandle("r")
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        handle.push(TokenOutput("r", [i], piece, reason if last else None, 3, i + 1))

    def base() -> dict:
        return {"id": "r", "object": "chat.completion.chunk", "created": 0, "model": "m"}

    async def collect() -> list[bytes]:
        return [event async for event in tool_events(handle, lambda: None, plan, base)]

    events = asyncio.run(collect())
    assert events[-1] == b"data: [DONE]\n\n"
    return [ChatCompletionChunk.model_validate_json(e[6:]) for e in events[:-1]]


def test_auto_streams_text_then_the_parsed_calls() -> None:
    pieces = ["Sure", " <tool", '_call>{"name": "add", ', '"arguments": {"a": 7}}</tool_call>']
    chunks = stream({}, pieces, FinishReason.STOP)
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert content == "Sure "  # "<tool" was held back, never sent as text
    assert len(calls) == 1 and calls[0].function and calls[0].function.name == "add"
    assert json.loads(calls[0].function.arguments or "") == {"a": 7}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_text_without_a_call_streams_whole() -> None:
    chunks = stream({}, ["a <tool", "box>"], FinishReason.LENGTH)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "a <toolbox>"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_named_streams_arguments_as_they_grow() -> None:
    pieces = ['{"a"', ": 4", "}"]
    chunks = stream(
        {"tool_choice": {"type": "function", "function": {"name": "add"}}},
        pieces,
        FinishReason.STOP,
    )
    opening = chunks[0].choices[0].delta.tool_calls
    assert opening and opening[0].id and opening[0].function and opening[0].function.name == "add"
    args = [
        t.function.arguments
        for c in chunks[1:]
        for t in c.choices[0].delta.tool_calls or []
        if t.function
    ]
    # outputs already there when the stream wakes go out as one chunk: joined, they are the text
    assert "".join(a or "" for a in args) == "".join(pieces)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
