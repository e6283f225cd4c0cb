"""/v1/messages through the official `anthropic` SDK against a live server on the tiny llama:
create, stream (every event checked against the final message), count_tokens, a forced tool_use
whose input validates against its JSON Schema 2020-12 (`jsonschema`), a tool_result turn, and the
same text the chat path gives for the same conversation (the `openai` SDK as the reference)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from runtime.models.tokenizer import Tokenizer
from tests.runtime.engine.support import RecordingSink
from tests.runtime.server.live import API_KEY, LiveServer

# the SDK no longer sends sampling fields itself (newer Claude models take none): extra_body does
GREEDY = {"temperature": 0}
SYSTEM = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
HELLO: list[Any] = [{"role": "user", "content": "Say hello to the page tables."}]
# a tool as Claude Code's tool libraries write it (JSON Schema 2020-12)
LOOKUP_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "kind": {"const": "page"},
        "tier": {"enum": ["gpu", "cpu"]},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
        "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        "when": {
            "anyOf": [{"type": "string", "format": "date", "maxLength": 10}, {"type": "null"}]
        },
        "labels": {
            "type": "object",
            "propertyNames": {"pattern": "^[a-z]+$"},
            "additionalProperties": {"type": "integer"},
            "maxProperties": 0,
        },
    },
    "required": ["kind", "tier", "count", "name", "when", "labels"],
    "additionalProperties": False,
}
LOOKUP = {"name": "lookup", "description": "find pages", "input_schema": LOOKUP_SCHEMA}


@pytest.fixture(scope="module")
def client(served: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served.url, api_key=API_KEY, max_retries=0)


def chat_text(served: LiveServer, messages: list[dict[str, Any]], max_tokens: int) -> str:
    reference = openai.OpenAI(base_url=f"{served.url}/v1", api_key=API_KEY, max_retries=0)
    out = reference.chat.completions.create(
        model="llama",
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,  # type: ignore[arg-type]
    )
    return out.choices[0].message.content or ""


def test_create_answers_as_the_chat_path_does(
    client: anthropic.Anthropic, served: LiveServer
) -> None:
    message = client.messages.create(
        model="llama",
        max_tokens=12,
        extra_body=GREEDY,
        system=SYSTEM,
        messages=HELLO,  # type: ignore[arg-type]
    )
    assert message.type == "message" and message.role == "assistant" and message.model == "llama"
    assert message.id.startswith("msg_")
    assert message.stop_reason in ("end_turn", "max_tokens")
    text = "".join(block.text for block in message.content if block.type == "text")
    expected = chat_text(served, [{"role": "system", "content": "Be brief."}, *HELLO], 12)
    assert text == expected
    assert message.usage.output_tokens >= 1
    counted = client.messages.count_tokens(model="llama", system=SYSTEM, messages=HELLO)  # type: ignore[arg-type]
    cache_read = message.usage.cache_read_input_tokens or 0
    assert message.usage.input_tokens + cache_read == counted.input_tokens


def test_count_tokens_is_the_rendered_prompt(
    client: anthropic.Anthropic, served: LiveServer
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, *HELLO]
    tokenized = served_tokenize(served, messages)
    counted = client.messages.count_tokens(model="llama", system="Be brief.", messages=HELLO)
    assert counted.input_tokens == tokenized


def served_tokenize(served: LiveServer, messages: list[dict[str, Any]]) -> int:
    import httpx

    response = httpx.post(
        f"{served.url}/tokenize",
        json={"model": "llama", "messages": messages, "add_special_tokens": True},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert response.status_code == 200, response.text
    return int(response.json()["count"])


def test_stream_events_join_to_the_final_message(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="llama",
        max_tokens=16,
        extra_body=GREEDY,
        messages=HELLO,  # type: ignore[arg-type]
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events]
    # the SDK drops `ping` and adds helper events (`text`) after the raw ones they come from
    raw = [kind for kind in kinds if kind not in ("text", "input_json")]
    assert raw[0] == "message_start" and raw[-2:] == ["message_delta", "message_stop"]
    deltas = [e for e in events if e.type == "content_block_delta"]
    text = "".join(e.delta.text for e in deltas if e.delta.type == "text_delta")
    assert [b.type for b in final.content] == (["text"] if text else [])
    assert text == "".join(b.text for b in final.content if b.type == "text")
    starts = [e.index for e in events if e.type == "content_block_start"]
    stops = [e.index for e in events if e.type == "content_block_stop"]
    assert starts == stops == list(range(len(final.content)))
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.delta.stop_reason == final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens == delta.usage.output_tokens >= 1
    # the same request unstreamed gives the same message (greedy)
    again = client.messages.create(model="llama", max_tokens=16, extra_body=GREEDY, messages=HELLO)  # type: ignore[arg-type]
    assert [b.model_dump() for b in again.content] == [
        {"type": "text", "text": text, "citations": None}
    ][: len(final.content)]
    assert again.stop_reason == final.stop_reason


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_use_input_validates(client: anthropic.Anthropic, stream: bool) -> None:
    fields: dict[str, Any] = {
        "model": "llama",
        "max_tokens": 200,
        "extra_body": GREEDY,
        "messages": [{"role": "user", "content": "Find the pages."}],
        "tools": [LOOKUP, {"name": "other", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "lookup"},
    }
    if stream:
        with client.messages.stream(**fields) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**fields)
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "lookup" and block.id.startswith("toolu_")
    jsonschema.Draft202012Validator(LOOKUP_SCHEMA).validate(block.input)


def test_any_tool_choice_calls_one_of_the_tools(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model="llama",
        max_tokens=200,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Find the pages."}],
        tools=[LOOKUP],  # type: ignore[list-item]
        tool_choice={"type": "any"},
    )
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "lookup"
    jsonschema.Draft202012Validator(LOOKUP_SCHEMA).validate(block.input)


def test_tool_result_turn_renders_as_the_chat_path(
    client: anthropic.Anthropic, served: LiveServer
) -> None:
    call_input = {
        "kind": "page",
        "tier": "gpu",
        "count": 2,
        "name": "kv",
        "when": None,
        "labels": {},
    }
    messages: list[Any] = [
        {"role": "user", "content": "Find the pages."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "a lookup", "signature": "sig"},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": call_input},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "3 pages"}],
                    "cache_control": {"type": "ephemeral"},
                },
                {"type": "text", "text": "Summarize."},
            ],
        },
    ]
    message = client.messages.create(
        model="llama",
        max_tokens=10,
        extra_body=GREEDY,
        messages=messages,
        tool_choice={"type": "none"},
    )
    text = "".join(b.text for b in message.content if b.type == "text")
    expected = chat_text(
        served,
        [
            {"role": "user", "content": "Find the pages."},
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": json.dumps(call_input)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "3 pages"},
            {"role": "user", "content": "Summarize."},
        ],
        10,
    )
    assert text == expected


def test_stop_sequence_is_named(client: anthropic.Anthropic) -> None:
    first = client.messages.create(model="llama", max_tokens=16, extra_body=GREEDY, messages=HELLO)  # type: ignore[arg-type]
    text = "".join(b.text for b in first.content if b.type == "text")
    assert len(text) >= 4, "the greedy answer is too short to cut"
    stop = text[2:4]
    cut = client.messages.create(
        model="llama",
        max_tokens=16,
        extra_body=GREEDY,
        messages=HELLO,
        stop_sequences=[stop],  # type: ignore[arg-type]
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert "".join(b.text for b in cut.content if b.type == "text") == text[: text.index(stop)]


def test_huge_max_tokens_is_clamped_to_the_context(client: anthropic.Anthropic) -> None:
    # Claude Code sends 32,000 whatever the model: the stream starts (no 400); closed at once
    with client.messages.stream(model="llama", max_tokens=32_000, messages=HELLO) as stream:  # type: ignore[arg-type]
        first = next(iter(stream))
    assert first.type == "message_start"


def test_prompt_beyond_the_context_is_refused_in_anthropic_words(
    client: anthropic.Anthropic,
) -> None:
    long = [{"role": "user", "content": "page " * 3000}]
    with pytest.raises(anthropic.BadRequestError) as err:
        # a timeout of its own: the SDK refuses to wait unstreamed for 32,000 tokens
        client.messages.create(model="llama", max_tokens=32_000, messages=long, timeout=60)  # type: ignore[arg-type]
    assert err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert err.value.body["error"]["message"].startswith("prompt is too long: ")  # type: ignore[index]
    assert err.value.body["error"]["message"].endswith(" tokens > 2047 maximum")  # type: ignore[index]


def test_prefill_is_continued(
    client: anthropic.Anthropic, served: LiveServer, demo_model_dir: Callable[[str], Path]
) -> None:
    """A last assistant turn is continued: the prompt is the template's up to the new assistant
    turn, then that text (what a raw completion of the same string gives)."""
    messages: list[Any] = [*HELLO, {"role": "assistant", "content": "Hello"}]
    message = client.messages.create(
        model="llama", max_tokens=8, extra_body=GREEDY, messages=messages
    )
    tokenizer = Tokenizer.from_dir(demo_model_dir("llama"))
    prompt = tokenizer.apply_chat_template(HELLO) + "Hello"
    reference = openai.OpenAI(base_url=f"{served.url}/v1", api_key=API_KEY, max_retries=0)
    raw = reference.completions.create(model="llama", prompt=prompt, max_tokens=8, temperature=0)
    assert "".join(b.text for b in message.content if b.type == "text") == raw.choices[0].text


def test_unknown_model_is_not_found(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=HELLO)  # type: ignore[arg-type]
    assert err.value.body["type"] == "error"  # type: ignore[index]
    assert err.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="claude-sonnet-4-5", messages=HELLO)  # type: ignore[arg-type]


def test_keys_by_x_api_key_or_bearer(served: LiveServer) -> None:
    bearer = anthropic.Anthropic(base_url=served.url, auth_token=API_KEY, max_retries=0)
    assert bearer.messages.count_tokens(model="llama", messages=HELLO).input_tokens > 0  # type: ignore[arg-type]
    wrong = anthropic.Anthropic(base_url=served.url, api_key="wrong", max_retries=0)
    # no key at all: the SDK sends none only when told to leave the header out
    keyless = anthropic.Anthropic(
        base_url=served.url, default_headers={"Authorization": anthropic.Omit()}, max_retries=0
    )
    for nobody in (wrong, keyless):
        with pytest.raises(anthropic.AuthenticationError) as err:
            nobody.messages.create(model="llama", max_tokens=4, messages=HELLO)  # type: ignore[arg-type]
        assert err.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_a_dropped_stream_cancels_its_request(served: LiveServer) -> None:
    sink = RecordingSink()
    served.state.stats.add(sink)
    body = {"model": "llama", "max_tokens": 32_000, "stream": True, "messages": HELLO, **GREEDY}
    headers = {"x-api-key": API_KEY}
    with httpx.stream("POST", f"{served.url}/v1/messages", json=body, headers=headers) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        start = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        next(line for line in lines if '"content_block_delta"' in line)
    # leaving the block closed the connection with the stream unfinished
    request_id = "msg-" + start["message"]["id"].removeprefix("msg_")
    deadline = time.monotonic() + 60
    while request_id not in sink.by_id():
        assert time.monotonic() < deadline, "the dropped request was never reported"
        time.sleep(0.05)
    record = sink.by_id()[request_id]
    assert record.finished_reason == "cancelled" and record.completion_tokens < 1500
