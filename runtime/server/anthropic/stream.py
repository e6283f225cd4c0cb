"""The Messages stream: `message_start`, `ping`, per content block `content_block_start`,
`content_block_delta` (`text_delta` / `input_json_delta`) and `content_block_stop`, then
`message_delta` (stop_reason, stop_sequence, usage) and `message_stop`. A failure after the
stream began is `event: error` with Anthropic's error body, and the stream ends.

Tool calls, by the plan's mode (runtime.server.openai.tools.plan):
- named (`tool_choice` `{"type": "tool"}`): one tool_use block opens at once and every text delta
  is a piece of its input JSON, live, as the constrained output grows;
- required (`any`) and auto: text streams until a `<tool_call>` could begin (auto; `any` holds it
  all), the rest is held and, at the end, parsed into tool_use blocks (each input in one
  `input_json_delta`), or sent as text when it holds no call.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from runtime.engine.request import RequestHandle
from runtime.engine.stats import FinishReason
from runtime.errors import FastllmError, RequestCancelled
from runtime.models.tokenizer import Tokenizer
from runtime.server.anthropic.errors import anthropic_error
from runtime.server.anthropic.reply import stop_of, tool_calls, tool_use_id, usage
from runtime.server.openai.tools import ToolPlan
from runtime.server.openai.tools.parse import OPEN_TAG

__all__ = ["message_events", "sse_event"]


def sse_event(payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"event: {payload['type']}\ndata: {data}\n\n".encode()


def _tag_prefix_len(text: str) -> int:
    """Length of the longest suffix of `text` that could begin the tool-call tag."""
    for n in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if text.endswith(OPEN_TAG[:n]):
            return n
    return 0


class _Blocks:
    """Content blocks as events: opens, deltas and stops, with their indexes."""

    def __init__(self) -> None:
        self.index = -1
        self.open_type: str | None = None

    def start(self, block: dict[str, Any]) -> list[bytes]:
        events = self.stop()
        self.index += 1
        self.open_type = block["type"]
        start = {"type": "content_block_start", "index": self.index, "content_block": block}
        return [*events, sse_event(start)]

    def text(self, text: str) -> list[bytes]:
        events = [] if self.open_type == "text" else self.start({"type": "text", "text": ""})
        delta = {"type": "text_delta", "text": text}
        return [*events, self._delta(delta)]

    def tool_use(self, name: str, partial_json: str, *, call_id: str | None = None) -> list[bytes]:
        block = {"type": "tool_use", "id": call_id or tool_use_id(), "name": name, "input": {}}
        events = self.start(block)
        return [*events, self.input_json(partial_json)] if partial_json else events

    def input_json(self, partial_json: str) -> bytes:
        return self._delta({"type": "input_json_delta", "partial_json": partial_json})

    def stop(self) -> list[bytes]:
        if self.open_type is None:
            return []
        self.open_type = None
        return [sse_event({"type": "content_block_stop", "index": self.index})]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_event({"type": "content_block_delta", "index": self.index, "delta": delta})


class _Splitter:
    """What of the generated text can go out now; the rest is held for the end."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.sent = 0  # characters of `text` already out
        self.holding = plan.mode == "required"

    def push(self, delta: str) -> str:
        self.text += delta
        if self.plan.mode in ("named", "none") or not self.plan.is_offered:
            out, self.sent = self.text[self.sent :], len(self.text)
            return out
        if self.holding:
            return ""
        if OPEN_TAG in self.text[self.sent :]:
            self.holding = True
            cut = self.text.index(OPEN_TAG, self.sent)
            out, self.sent = self.text[self.sent : cut], cut
            return out
        end = max(self.sent, len(self.text) - _tag_prefix_len(self.text))
        out, self.sent = self.text[self.sent : end], end
        return out

    @property
    def held(self) -> str:
        return self.text[self.sent :]


async def message_events(
    handle: RequestHandle,
    cancel: Callable[[], object],
    start: dict[str, Any],
    plan: ToolPlan,
    tokenizer: Tokenizer,
    stop_sequences: Sequence[str],
) -> AsyncIterator[bytes]:
    """`start`: the message of `message_start` (empty content, usage of the prompt)."""
    blocks, splitter = _Blocks(), _Splitter(plan)
    token_ids: list[int] = []
    is_named = plan.is_offered and plan.mode == "named"
    try:
        yield sse_event({"type": "message_start", "message": start})
        if is_named:
            for event in blocks.tool_use(plan.name or "", ""):
                yield event
        yield sse_event({"type": "ping"})
        async for outputs in handle.batches():
            last = outputs[-1]
            for out in outputs:
                token_ids.extend(out.token_ids)
            now = splitter.push("".join(out.text for out in outputs))
            if now:
                for event in [blocks.input_json(now)] if is_named else blocks.text(now):
                    yield event
            error: FastllmError | None = last.error
            if error is None and last.finished_reason == FinishReason.CANCELLED:
                error = RequestCancelled("the request was cancelled")
            if error is not None:
                _, body = anthropic_error(error.http_status, error.message)
                yield sse_event(body)
                return
            if last.finished_reason is None:
                continue
            stop = stop_of(last.finished_reason, token_ids, stop_sequences, tokenizer)
            stop_reason, stop_sequence = stop
            if is_named:
                is_call = last.finished_reason == "stop" and bool(
                    tool_calls(plan, splitter.text)[1]
                )
                stop_reason, stop_sequence = ("tool_use", None) if is_call else stop
            elif splitter.held:
                text, calls = tool_calls(plan, splitter.held)
                if last.finished_reason != "stop" or not calls:
                    text, calls = splitter.held, []
                for event in blocks.text(text) if text else []:
                    yield event
                for call in calls:
                    for event in blocks.tool_use(
                        call["name"],
                        json.dumps(call["input"], ensure_ascii=False),
                        call_id=call["id"],
                    ):
                        yield event
                if calls:
                    stop_reason, stop_sequence = "tool_use", None
            for event in blocks.stop():
                yield event
            counts = usage(last.prompt_tokens, last.completion_tokens, last.cached_tokens)
            delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
            yield sse_event({"type": "message_delta", "delta": delta, "usage": counts})
            stop_event: dict[str, Any] = {"type": "message_stop"}
            if last.metrics is not None:  # enable_request_metrics: on the final event
                stop_event["metrics"] = last.metrics.as_dict()
            yield sse_event(stop_event)
    finally:
        if not handle.finished:
            cancel()  # the client went away mid-stream: free the request's KV now
