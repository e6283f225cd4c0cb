"""Streamed chat with tools: `delta.tool_calls` chunks as OpenAI sends them.

- named: the first chunk opens the call (id, name, `arguments: ""`); each text delta is a piece
  of `arguments`, live, as the constrained output grows.
- required / auto: text is held from the first `<tool_call>` (auto streams the content before
  it, holding back a tail that could start the tag); at the end the held text is parsed and each
  call goes out as one `delta.tool_calls` entry. Held text that is no call goes out as content.
The last chunk's finish_reason is "tool_calls" when calls were sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from runtime.engine.request import RequestHandle
from runtime.engine.stats import FinishReason
from runtime.errors import FastllmError, RequestCancelled
from runtime.server.errors import error_payload
from runtime.server.openai.streaming import DONE, sse, with_metrics
from runtime.server.openai.tools.parse import OPEN_TAG, new_call_id, parse_tool_calls
from runtime.server.openai.tools.plan import ToolPlan

__all__ = ["tool_events"]


def _held_tail(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of the open tag."""
    for n in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if text.endswith(OPEN_TAG[:n]):
            return n
    return 0


class _Splitter:
    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""  # everything generated
        self.sent = 0  # characters of `text` already sent as content or arguments
        self.holding = plan.mode == "required"

    def push(self, delta: str) -> str:
        """What can go out now (content, or named arguments)."""
        self.text += delta
        if self.plan.mode == "named":
            out, self.sent = self.text[self.sent :], len(self.text)
            return out
        if not self.holding and OPEN_TAG in self.text[self.sent :]:
            self.holding = True
            cut = self.text.index(OPEN_TAG, self.sent)
            out, self.sent = self.text[self.sent : cut], cut
            return out
        if self.holding:
            return ""
        end = len(self.text) - _held_tail(self.text)
        out, self.sent = self.text[self.sent : end], max(self.sent, end)
        return out


async def tool_events(
    handle: RequestHandle,
    cancel: Callable[[], object],
    plan: ToolPlan,
    base: Callable[[], dict[str, Any]],
    usage: Callable[[int, int, int], dict[str, Any]] | None = None,
) -> AsyncIterator[bytes]:
    def chunk(
        delta: dict[str, Any], finish_reason: str | None = None, metrics: Any = None
    ) -> bytes:
        payload = base()
        payload["choices"] = [
            {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        ]
        return sse(with_metrics(payload, metrics, usage))

    def arguments(index: int, text: str) -> dict[str, Any]:
        return {"tool_calls": [{"index": index, "function": {"arguments": text}}]}

    splitter = _Splitter(plan)
    counts = (0, 0, 0)
    metrics: dict[str, Any] | None = None
    try:
        opening: dict[str, Any] = {"role": "assistant", "content": None if plan.name else ""}
        if plan.mode == "named":
            opening["tool_calls"] = [
                {
                    "index": 0,
                    "id": new_call_id(),
                    "type": "function",
                    "function": {"name": plan.name, "arguments": ""},
                }
            ]
        yield chunk(opening)
        async for outputs in handle.batches():
            last = outputs[-1]
            counts = (last.prompt_tokens, last.completion_tokens, last.cached_tokens)
            out = splitter.push("".join(o.text for o in outputs))
            error: FastllmError | None = last.error
            if error is None and last.finished_reason == FinishReason.CANCELLED:
                error = RequestCancelled("the request was cancelled")
            if out:
                yield chunk(arguments(0, out) if plan.mode == "named" else {"content": out})
            if error is not None:
                yield sse(error_payload(error.message, error.error_type, code=error.code))
                return
            if last.metrics is not None:  # enable_request_metrics: on the last data chunk
                metrics = last.metrics.as_dict()
            if last.finished_reason is not None:
                yield chunk(*_final(plan, splitter, last.finished_reason), metrics)
        if usage is not None:
            yield sse(with_metrics(usage(*counts), metrics))
        yield DONE
    finally:
        if not handle.finished:
            cancel()


def _final(plan: ToolPlan, splitter: _Splitter, reason: str) -> tuple[dict[str, Any], str]:
    """The last chunk's delta and finish_reason."""
    if plan.mode == "named":
        parsed = parse_tool_calls(plan, splitter.text)
        return {}, "tool_calls" if parsed.tool_calls and reason == "stop" else reason
    held = splitter.text[splitter.sent :]
    parsed = parse_tool_calls(plan, held)
    if not parsed.tool_calls or reason != "stop":
        return ({"content": held} if held else {}), reason
    calls = [{"index": i, **call} for i, call in enumerate(parsed.tool_calls)]
    return {"tool_calls": calls}, "tool_calls"
