"""POST /v1/responses through the official `openai` SDK against a live server on the tiny random
llama: the response objects validate against the SDK's own `Response` model, forced calls carry
arguments that `jsonschema` accepts, and `responses.parse` returns the pydantic object. The random
weights say nothing sensible, so these tests check structure and usage, not content."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response
from pydantic import BaseModel, Field

from tests.runtime.server.live import API_KEY, LiveServer

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "the forecast",
    "parameters": WEATHER,
    "strict": True,
}


class Flag(BaseModel):
    ok: bool
    level: int = Field(ge=-3, le=3)


@pytest.fixture
def client(served: LiveServer) -> Iterator[openai.OpenAI]:
    url = f"{served.url}/v1"
    with openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=60) as client:
        yield client


def _raw(served: LiveServer, body: dict) -> httpx.Response:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    return httpx.post(f"{served.url}/v1/responses", json=body, headers=headers, timeout=60)


def _prompt_tokens(served: LiveServer, messages: list[dict]) -> int:
    tokenizer = served.state.router.pick("llama").engine.tokenizer
    return len(tokenizer.encode(tokenizer.apply_chat_template(messages)))


def test_string_input_gives_a_response_object_the_sdk_validates(served: LiveServer) -> None:
    reply = _raw(served, {"model": "llama", "input": "Hello", "max_output_tokens": 5})
    assert reply.status_code == 200, reply.text
    result = Response.model_validate(reply.json())  # the SDK's model, validated (not constructed)
    assert result.object == "response" and result.id.startswith("resp_")
    assert result.model == "llama" and result.store is False and result.tools == []
    message = result.output[0]
    assert message.type == "message" and message.id.startswith("msg_")
    assert message.role == "assistant" and message.content[0].type == "output_text"
    assert message.content[0].annotations == []
    usage = result.usage
    assert usage is not None
    assert usage.input_tokens == _prompt_tokens(served, [{"role": "user", "content": "Hello"}])
    assert usage.output_tokens <= 5 and usage.output_tokens_details.reasoning_tokens == 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens <= usage.input_tokens


def test_instructions_and_items_render_as_the_chat_template(
    client: openai.OpenAI, served: LiveServer
) -> None:
    items = [
        {"role": "developer", "content": "Be terse."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello", "annotations": []}],
        },
        {"role": "user", "content": "More"},
    ]
    result = client.responses.create(
        model="llama", instructions="Answer.", input=items, max_output_tokens=4, temperature=0
    )
    expected = [
        {"role": "system", "content": "Answer.\n\nBe terse."},  # one system message
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "More"},
    ]
    assert result.usage is not None
    assert result.usage.input_tokens == _prompt_tokens(served, expected)
    assert result.instructions == "Answer." and result.temperature == 0
    # greedy: the same text as chat completions on the same messages
    chat = client.chat.completions.create(
        model="llama", messages=expected, max_tokens=4, temperature=0
    )
    assert result.output_text == chat.choices[0].message.content


def test_max_output_tokens_makes_an_incomplete_response(client: openai.OpenAI) -> None:
    result = client.responses.create(
        model="llama", input="Count", max_output_tokens=3, temperature=0, top_p=0.5
    )
    # the tiny model may stop early; when it does not, the response says why it is incomplete
    assert result.usage is not None
    if result.usage.output_tokens == 3:
        assert result.status == "incomplete"
        assert result.incomplete_details is not None
        assert result.incomplete_details.reason == "max_output_tokens"
        assert result.output[0].status == "incomplete"
    assert result.max_output_tokens == 3 and result.top_p == 0.5


def test_logprobs_when_asked(client: openai.OpenAI, served: LiveServer) -> None:
    result = client.responses.create(
        model="llama",
        input="Hi",
        max_output_tokens=4,
        top_logprobs=2,
        include=["message.output_text.logprobs"],
    )
    part = result.output[0].content[0]
    assert part.logprobs is not None and len(part.logprobs) == result.usage.output_tokens
    for entry in part.logprobs:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
    # a sampled character may span byte tokens (each token's own text is then U+FFFD): the
    # tokens' bytes, joined, are the text
    joined = b"".join(bytes(e.bytes) for e in part.logprobs)
    assert joined.decode("utf-8", "replace").startswith(part.text[:1])


def test_parse_returns_the_pydantic_object(client: openai.OpenAI) -> None:
    for _ in range(3):
        result = client.responses.parse(
            model="llama", input="Flag it", text_format=Flag, max_output_tokens=100
        )
        assert result.status == "completed"
        assert isinstance(result.output_parsed, Flag)
        assert result.text is not None and result.text.format.type == "json_schema"


def test_json_object_format_gives_json(client: openai.OpenAI) -> None:
    result = client.responses.create(
        model="llama",
        input="Give JSON",
        text={"format": {"type": "json_object"}},
        max_output_tokens=60,
    )
    assert result.output_text.startswith("{")
    if result.status == "completed":
        assert isinstance(json.loads(result.output_text), dict)


def test_forced_function_call_and_its_output_round_trip(
    client: openai.OpenAI, served: LiveServer
) -> None:
    first = client.responses.create(
        model="llama",
        input="Weather in Oslo?",
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
    )
    assert first.status == "completed"
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.id is not None and call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert first.tool_choice.name == "get_weather" and first.tools[0].name == "get_weather"
    # the call and its output go back as input items; the call is rendered as the template's
    # assistant turn and the output as its tool turn
    items = [
        {"role": "user", "content": "Weather in Oslo?"},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    second = client.responses.create(
        model="llama", input=items, tools=[TOOL], tool_choice="none", max_output_tokens=5
    )
    assert second.output[0].type == "message"
    # the same turns through chat completions make the same prompt
    function = {"name": call.name, "arguments": call.arguments}
    chat = client.chat.completions.create(
        model="llama",
        messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call.call_id, "type": "function", "function": function}],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"},
        ],
        max_tokens=1,
    )
    assert second.usage is not None and chat.usage is not None
    assert second.usage.input_tokens == chat.usage.prompt_tokens


def test_required_tool_choice_calls_one_of_the_tools(client: openai.OpenAI) -> None:
    other = {
        "type": "function",
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["a"],
            "additionalProperties": False,
        },
    }
    result = client.responses.create(
        model="llama",
        input="Do it",
        tools=[TOOL, other, {"type": "web_search"}],
        tool_choice="required",
        max_output_tokens=80,
    )
    assert result.status == "completed"
    calls = [item for item in result.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name in ("get_weather", "add")
    schema = WEATHER if calls[0].name == "get_weather" else other["parameters"]
    jsonschema.validate(json.loads(calls[0].arguments), schema)
    # the hosted tool was left out, and the response says so
    assert [t.type for t in result.tools] == ["function", "function"]
    assert "web_search" in result.model_extra["warnings"][0]


def test_namespace_tools_are_flattened(client: openai.OpenAI) -> None:
    namespace = {"type": "namespace", "name": "weather", "description": "w", "tools": [TOOL]}
    result = client.responses.create(
        model="llama",
        input="Weather?",
        tools=[namespace],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
    )
    (call,) = result.output
    assert call.name == "get_weather" and call.namespace == "weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
