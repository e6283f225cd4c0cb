"""Server-sent events for streamed completions: `data: {json}` per delta, then `data: [DONE]`.

An error after the stream started can no longer change the status code, so it is sent as
`data: {"error": {...}}` and the stream ends. A client that goes away cancels its request at once:
`EventStream` watches for `http.disconnect` while it streams (also before the first token, when
no write would notice), and the generator's `finally` cancels the engine request, which frees
its KV space.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from runtime.engine.request import RequestHandle, TokenOutput
from runtime.engine.stats import FinishReason
from runtime.errors import FastllmError, RequestCancelled
from runtime.server.errors import error_payload

# builds one chunk's JSON object from (text delta, finish_reason)
ChunkBuilder = Callable[[str, str | None], dict[str, Any]]
# the same from the outputs behind the delta too (logprobs, echo: runtime.server.openai.logprobs)
OutputsChunkBuilder = Callable[[list[TokenOutput], str, str | None], dict[str, Any]]


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
_MARKER = "\x00fastllm-text\x00"


def text_event_builder(chunk: ChunkBuilder) -> Callable[[str], bytes]:
    """`sse(chunk(text, None))` for a non-empty text, without building and encoding the whole
    envelope per token: it is serialized once around a marker, and each event splices in the
    JSON string of its text (the same bytes `sse` would give)."""
    marker = json.dumps(_MARKER)
    head, found, tail = sse(chunk(_MARKER, None)).partition(marker.encode())
    if not found or marker.encode() in tail:  # the text is not one plain field: no shortcut
        return lambda text: sse(chunk(text, None))
    return lambda text: b"".join((head, json.dumps(text).encode(), tail))


class EventStream(StreamingResponse):
    media_type = "text/event-stream"

    def __init__(
        self, content: AsyncIterator[bytes], on_close: Callable[[], object] | None = None
    ) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close  # runs however the response ends (even before the first chunk)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Always race the stream against the disconnect (starlette only does this for old ASGI
        # servers; with newer ones a disconnect is noticed only when a write fails).
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            if self.on_close is not None:
                self.on_close()


async def token_events(
    handle: RequestHandle,
    cancel: Callable[[], object],
    chunk: ChunkBuilder,
    *,
    first: dict[str, Any] | None = None,
    usage: Callable[[int, int, int], dict[str, Any]] | None = None,
    rich: OutputsChunkBuilder | None = None,
) -> AsyncIterator[bytes]:
    """SSE bytes for one request's outputs. `first`: an opening chunk (chat's role delta);
    `usage`: builds the final usage-only chunk (stream_options.include_usage); `rich`: builds
    every chunk from its outputs instead (one per wake-up, also when the text is held back, so
    each token's logprobs go out with the chunk of that token)."""
    prompt_tokens = completion_tokens = cached_tokens = 0
    metrics: dict[str, Any] | None = None  # enable_request_metrics: on the last data chunk
    text_event = text_event_builder(chunk)
    try:
        if first is not None:
            yield sse(first)
        # every output already there becomes one chunk (one write per wake-up, not per token;
        # OpenAI clients take multi-token deltas)
        async for outputs in handle.batches():
            last = outputs[-1]
            prompt_tokens, completion_tokens = last.prompt_tokens, last.completion_tokens
            cached_tokens = last.cached_tokens
            text = "".join([out.text for out in outputs])
            error: FastllmError | None = last.error
            if error is None and last.finished_reason == FinishReason.CANCELLED:
                error = RequestCancelled("the request was cancelled")
            if error is not None:
                if text:
                    yield text_event(text) if rich is None else sse(rich(outputs, text, None))
                yield sse(error_payload(error.message, error.error_type, code=error.code))
                return
            if last.metrics is not None:
                metrics = last.metrics.as_dict()
            if rich is not None:
                yield sse(with_metrics(rich(outputs, text, last.finished_reason), metrics, usage))
            elif last.finished_reason is not None:
                yield sse(with_metrics(chunk(text, last.finished_reason), metrics, usage))
            elif text:
                yield text_event(text)
        if usage is not None:
            yield sse(with_metrics(usage(prompt_tokens, completion_tokens, cached_tokens), metrics))
        yield DONE
    finally:
        if not handle.finished:
            cancel()  # the client went away mid-stream: free the request's KV now


def with_metrics(
    payload: dict[str, Any], metrics: dict[str, Any] | None, then: object = None
) -> dict[str, Any]:
    """The chunk with the request's `metrics`, unless a later chunk (`then`: the usage chunk)
    carries them."""
    if metrics is not None and then is None:
        payload["metrics"] = metrics
    return payload
