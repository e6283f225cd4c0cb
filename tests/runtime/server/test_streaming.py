"""The SSE encoding of streamed chunks: the spliced fast path equals the plain encoding."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime.server.openai.streaming import sse, text_event_builder


def completion_chunk(text: str, finish_reason: str | None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 7,
        "model": "m",
        "choices": [choice],
    }


def chat_chunk(text: str, finish_reason: str | None) -> dict[str, Any]:
    delta = {"content": text} if text else {}
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
    return {
        "id": "chat-1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "choices": [choice],
    }


def text_twice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"a": text, "b": text}  # the text is not one field: the builder must not splice


@pytest.mark.parametrize("chunk", [completion_chunk, chat_chunk, text_twice])
@pytest.mark.parametrize("text", ["a", ' "q" \\ \n\t', "héllo 😀", "\x00fastllm-text\x00"])
def test_text_event_is_the_plain_encoding(chunk: Any, text: str) -> None:
    event = text_event_builder(chunk)(text)
    assert event == sse(chunk(text, None))
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert json.loads(event[len(b"data: ") :]) == chunk(text, None)
