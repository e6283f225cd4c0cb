"""The streamed chunks of completions and chat completions: a choice's text delta as the endpoint
sends it (`chunker`), the same with its logprobs (`rich_chunker`), and the streamed response's
OpenAPI description. Only a `stream: true` body builds them (runtime.server.openai.routes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.engine.request import TokenOutput
from runtime.server.openai import generate as gen

# the 200 of an endpoint that streams with `stream: true` (OpenAPI)
STREAMED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the completion, or with `stream: true` server-sent events",
        "content": {
            "text/event-stream": {
                # one server-sent event: `data` is a chunk's JSON, an error's JSON, or "[DONE]"
                "schema": {
                    "type": "object",
                    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
                    "required": ["data"],
                }
            }
        },
    }
}


def chunker(
    base: Callable[[], dict[str, Any]], part: Callable[[str], dict[str, Any]]
) -> gen.IndexedChunk:
    """A streamed chunk of one choice: `part` is its text as the endpoint sends it."""

    def chunk(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
        payload = base()
        choice = {"index": index, **part(text), "finish_reason": finish_reason, "logprobs": None}
        payload["choices"] = [choice]
        return payload

    return chunk


def rich_chunker(
    chunk: gen.IndexedChunk,
    shape: Callable[[int, list[TokenOutput], str], tuple[str, dict[str, Any] | None]],
) -> gen.IndexedOutputsChunk:
    """The chunk of a choice's outputs with their logprobs (and echo): `shape` gives both."""

    def rich(
        index: int, outputs: list[TokenOutput], text: str, finish_reason: str | None
    ) -> dict[str, Any]:
        text, logprobs = shape(index, outputs, text)
        payload = chunk(index, text, finish_reason)
        payload["choices"][0]["logprobs"] = logprobs
        return payload

    return rich
