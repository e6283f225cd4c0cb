"""Structured outputs and tool calling through the official `openai` client against a live server
on the tiny random llama: the grammar mask alone makes outputs parse (validated with pydantic,
`jsonschema` and `re`), whatever the random weights would have said."""

from __future__ import annotations

import json
import re
import time
from enum import Enum

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.runtime.server.live import API_KEY, LiveServer

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["C", "F"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": 0, "maximum": 99},
                    "b": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]
USER = [{"role": "user", "content": "What is the weather?"}]


class Color(str, Enum):
    RED = "red"
    GREEN = "green"


class Size(BaseModel):
    width: int = Field(ge=1, le=50)
    height: int = Field(ge=1, le=50)


class Item(BaseModel):  # nested object, enum, bounded numbers and array, an optional field
    name: str = Field(max_length=6)
    color: Color
    size: Size
    tags: list[bool] = Field(max_length=3)
    note: str | None = Field(default=None, max_length=4)


class Flag(BaseModel):
    ok: bool
    level: int = Field(ge=-3, le=3)


@pytest.fixture
def client(served: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.mark.parametrize("model", [Item, Flag])
def test_parse_with_a_pydantic_model_returns_a_parsed_object(
    client: openai.OpenAI, model: type[BaseModel]
) -> None:
    for seed in range(4):
        result = client.beta.chat.completions.parse(
            model="llama", messages=USER, response_format=model, max_tokens=200, seed=seed
        )
        choice = result.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, model)


def test_json_object_output_parses_when_it_completes(client: openai.OpenAI) -> None:
    completed = 0
    for seed in range(6):
        result = client.chat.completions.create(
            model="llama",
            messages=USER,
            max_tokens=60,
            seed=seed,
            response_format={"type": "json_object"},
        )
        choice = result.choices[0]
        if choice.finish_reason == "stop":  # a free object may outgrow max_tokens (counted)
            completed += 1
            assert isinstance(json.loads(choice.message.content or ""), dict)
        else:
            assert choice.message.content and choice.message.content.startswith("{")
    assert completed > 0


@pytest.mark.parametrize(
    "extra",
    [
        {"guided_choice": ["alpha", "beta", "gamma ray"]},
        {"structured_outputs": {"choice": ["alpha", "beta", "gamma ray"]}},
    ],
)
def test_choice_returns_one_of_the_choices_on_both_endpoints(
    client: openai.OpenAI, extra: dict
) -> None:
    for seed in range(3):
        chat = client.chat.completions.create(
            model="llama", messages=USER, max_tokens=20, seed=seed, extra_body=extra
        )
        assert chat.choices[0].message.content in ("alpha", "beta", "gamma ray")
        text = client.completions.create(
            model="llama", prompt="Pick:", max_tokens=20, seed=seed, extra_body=extra
        )
        assert text.choices[0].text in ("alpha", "beta", "gamma ray")


def test_every_choice_of_n_and_of_a_prompt_batch_follows_the_constraint(
    client: openai.OpenAI,
) -> None:
    """n > 1 forks choices from one prefill; each fork has its own matcher from the same grammar
    (its first token is masked too), and every prompt of a batch is constrained."""
    pattern = r"[A-Z]{2}-\d{2,4}"
    extra = {"guided_regex": pattern}
    out = client.completions.create(
        model="llama", prompt=["Code:", "Id:"], n=3, max_tokens=20, seed=1, extra_body=extra
    )
    assert len(out.choices) == 6
    assert all(re.fullmatch(pattern, c.text) for c in out.choices), [c.text for c in out.choices]
    chat = client.chat.completions.create(
        model="llama", messages=USER, n=4, max_tokens=20, seed=2,
        extra_body={"guided_choice": ["alpha", "beta", "gamma ray"]},
    )  # fmt: skip
    assert len(chat.choices) == 4
    assert all(c.message.content in ("alpha", "beta", "gamma ray") for c in chat.choices)
    with pytest.raises(openai.BadRequestError, match="tools with n > 1"):
        client.chat.completions.create(
            model="llama", messages=USER, n=2, max_tokens=8, tools=TOOLS, tool_choice="required"
        )


def test_regex_and_grammar_outputs_match(client: openai.OpenAI) -> None:
    pattern = r"[A-Z]{2}-\d{2,4}"
    grammar = 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9]'
    for seed in range(3):
        out = client.completions.create(
            model="llama",
            prompt="Code:",
            max_tokens=20,
            seed=seed,
            extra_body={"guided_regex": pattern},
        )
        assert re.fullmatch(pattern, out.choices[0].text)
        out = client.completions.create(
            model="llama",
            prompt="Sum:",
            max_tokens=40,
            seed=seed,
            extra_body={"structured_outputs": {"grammar": grammar}, "temperature": 0.0},
        )
        assert re.fullmatch(r"\([1-9](\+[1-9])*\)", out.choices[0].text) or (
            out.choices[0].finish_reason == "length"
        )


def test_named_tool_choice_returns_a_valid_call(client: openai.OpenAI) -> None:
    for seed in range(3):
        result = client.chat.completions.create(
            model="llama",
            messages=USER,
            tools=TOOLS,
            max_tokens=80,
            seed=seed,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
        choice = result.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls or []
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_named_tool_choice_streams_delta_tool_calls(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="llama",
        messages=USER,
        tools=TOOLS,
        max_tokens=80,
        seed=1,
        stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    names, arguments, reasons = [], "", []
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                if call.function and call.function.name:
                    names.append(call.function.name)
                arguments += (call.function.arguments or "") if call.function else ""
            reasons.append(choice.finish_reason)
    assert names == ["get_weather"] and reasons[-1] == "tool_calls"
    assert sum(1 for r in reasons if r) == 1
    jsonschema.validate(json.loads(arguments), WEATHER)


def test_required_tool_choice_calls_one_of_the_tools_streamed_and_not(
    client: openai.OpenAI,
) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    result = client.chat.completions.create(
        model="llama", messages=USER, tools=TOOLS, tool_choice="required", max_tokens=80, seed=2
    )
    (call,) = result.choices[0].message.tool_calls or []
    assert result.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    stream = client.chat.completions.create(
        model="llama",
        messages=USER,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=80,
        seed=2,
        stream=True,
    )
    calls = [c for chunk in stream for ch in chunk.choices for c in ch.delta.tool_calls or []]
    assert len(calls) == 1 and calls[0].function.name == call.function.name
    assert calls[0].function.arguments == call.function.arguments  # same seed, same call


def test_a_conversation_with_tool_results_is_accepted(client: openai.OpenAI) -> None:
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Oslo", "days": 1, "unit": "C"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": -3}'},
    ]
    result = client.chat.completions.create(
        model="llama", messages=messages, tools=TOOLS, max_tokens=5, seed=0
    )
    assert result.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("extra", "param", "needle"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}},
                    },
                }
            },
            "response_format",
            "nonsense",
        ),
        ({"guided_regex": "(?<=a)b"}, "guided_regex", "grammar engine"),
        ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex", "only one"),
        (
            {"tools": [{"type": "function", "function": {"description": "no name"}}]},
            "tools",
            "name",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "absent"}}},
            "tool_choice",
            "absent",
        ),
        (
            {"structured_outputs": {"regex": "a", "choice": ["b"]}},
            "structured_outputs",
            "exactly one",
        ),
    ],
)
def test_bad_constraints_are_typed_400s(
    client: openai.OpenAI, extra: dict, param: str, needle: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="llama", messages=USER, max_tokens=5, extra_body=extra)
    body = err.value.body
    assert isinstance(body, dict)
    assert body["param"] == param and body["type"] == "invalid_request_error"
    assert needle in body["message"]


def test_constrained_requests_show_in_metrics(client: openai.OpenAI, served: LiveServer) -> None:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    def read() -> dict[tuple[str, str], float]:
        text = httpx.get(f"{served.url}/metrics").text
        return {
            (s.name, s.labels.get("kind", "")): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name.startswith(("fastllm_constrained", "fastllm_grammar"))
            and s.labels.get("model") == "llama"
        }

    before = read()
    schema = {
        "type": "object",
        "properties": {"q": {"enum": [1, 2, 3]}},
        "required": ["q"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "q", "schema": schema}}
    for _ in range(2):  # a compile, then a cache hit
        client.chat.completions.create(
            model="llama", messages=USER, max_tokens=20, response_format=fmt
        )  # type: ignore[arg-type]
    key = ("fastllm_constrained_requests_total", "json")
    deadline = time.monotonic() + 30  # the engine hands stats to the sinks after the response
    while (after := read())[key] - before.get(key, 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert after[key] - before.get(key, 0) == 2
    hits, misses = "fastllm_grammar_cache_hits_total", "fastllm_grammar_cache_misses_total"
    assert after[(hits, "")] - before.get((hits, ""), 0) == 1
    assert after[(misses, "")] - before.get((misses, ""), 0) == 1
