"""The streamed response: typed server-sent events (`event: <type>` + `data: {...}`), numbered by
`sequence_number` from 0 up, in the order OpenAI sends them:

    response.created, response.in_progress,
    per message:  output_item.added, content_part.added, output_text.delta..., output_text.done,
                  content_part.done, output_item.done
    per call:     output_item.added, function_call_arguments.delta..., .done, output_item.done
    response.completed | response.incomplete (max_output_tokens) | response.failed (with `error`)

A forced function (`tool_choice` names it) streams its arguments live as the constrained output
grows. Otherwise text streams as message deltas, except what may be a tool call: from the first
`<tool_call>` on (and a tail that could start one) it is held, and at the end either becomes calls
or goes out as text (runtime.server.responses.objects.outcome decides, as for a joined response).
A message is opened at its first non-blank text, so blanks before a call make no empty message.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from runtime.engine.request import RequestHandle
from runtime.engine.stats import FinishReason
from runtime.errors import FastllmError, RequestCancelled
from runtime.server.openai.logprobs import TokenTexts, chat_logprobs, sampled_positions
from runtime.server.openai.tools.parse import new_call_id
from runtime.server.responses.objects import (
    Call,
    Draft,
    call_item,
    item_id,
    message_item,
    outcome,
    status_of,
    text_part,
    usage,
)
from runtime.server.responses.split import Splitter

__all__ = ["Saver", "response_events"]

# stores the final response object (store: true) before the final event goes out, so a client
# that continues at once with previous_response_id finds it
Saver = Callable[[dict[str, Any]], Awaitable[None]]


class _Sequence:
    """Numbers and encodes events; every event is also kept as `items` when it finishes one."""

    def __init__(self) -> None:
        self.number = 0
        self.items: list[dict[str, Any]] = []  # finished output items, in output order

    def __call__(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.number, **fields}
        self.number += 1
        data = json.dumps(payload, separators=(",", ":"))
        return b"event: " + kind.encode() + b"\ndata: " + data.encode() + b"\n\n"


class _Message:
    """The assistant message being streamed (opened at its first non-blank text)."""

    def __init__(self, event: _Sequence, want_logprobs: bool) -> None:
        self.event, self.id = event, item_id("msg")
        self.index: int | None = None  # output_index once opened
        self.pending, self.text = "", ""  # held blanks; the text sent
        self.pending_logprobs: list[dict[str, Any]] = []
        self.logprobs: list[dict[str, Any]] | None = [] if want_logprobs else None

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.id, "output_index": self.index, "content_index": 0}

    def _open(self) -> list[bytes]:
        self.index = len(self.event.items)
        item = message_item(self.id, None, "in_progress")
        return [
            self.event("response.output_item.added", output_index=self.index, item=item),
            self.event("response.content_part.added", part=text_part("", None), **self._where()),
        ]

    def push(self, delta: str, logprobs: list[dict[str, Any]], force: bool = False) -> list[bytes]:
        self.pending += delta
        self.pending_logprobs.extend(logprobs)
        out: list[bytes] = []
        if self.index is None:
            if not (force or self.pending.strip()):
                return out
            out.extend(self._open())
        if self.pending or (force and self.pending_logprobs):
            lp = self.pending_logprobs if self.logprobs is not None else []
            out.append(
                self.event(
                    "response.output_text.delta", delta=self.pending, logprobs=lp, **self._where()
                )
            )
            self.text += self.pending
            if self.logprobs is not None:
                self.logprobs.extend(self.pending_logprobs)
            self.pending, self.pending_logprobs = "", []
        return out

    def close(self, status: str) -> list[bytes]:
        out = self.push("", [], force=True)
        lp = self.logprobs or []
        part = text_part(self.text, self.logprobs)
        item = message_item(self.id, self.text, status, self.logprobs)
        out.append(
            self.event("response.output_text.done", text=self.text, logprobs=lp, **self._where())
        )
        out.append(self.event("response.content_part.done", part=part, **self._where()))
        out.append(self.event("response.output_item.done", output_index=self.index, item=item))
        self.event.items.append(item)
        return out


class _Call:
    """One function_call item being streamed; `live`: its arguments are the deltas sent."""

    def __init__(self, event: _Sequence, call: Call, namespace: str | None) -> None:
        self.event, self.call, self.namespace = event, call, namespace
        self.id, self.index = item_id("fc"), len(event.items)
        self.sent = ""

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.id, "output_index": self.index}

    def open(self) -> bytes:
        item = call_item(self.id, Call(self.call.call_id, self.call.name, ""), "in_progress")
        return self.event("response.output_item.added", output_index=self.index, item=item)

    def delta(self, text: str) -> bytes:
        self.sent += text
        return self.event("response.function_call_arguments.delta", delta=text, **self._where())

    def close(self, status: str) -> list[bytes]:
        done = Call(self.call.call_id, self.call.name, self.sent)
        item = call_item(self.id, done, status, self.namespace)
        self.event.items.append(item)
        return [
            self.event(
                "response.function_call_arguments.done",
                name=self.call.name,
                arguments=self.sent,
                **self._where(),
            ),
            self.event("response.output_item.done", output_index=self.index, item=item),
        ]


async def response_events(
    handle: RequestHandle,
    cancel: Callable[[], object],
    draft: Draft,
    texts: TokenTexts | None,
    on_final: Saver | None = None,
) -> AsyncIterator[bytes]:
    event, plan = _Sequence(), draft.tools.plan
    message = _Message(event, texts is not None)
    splitter = Splitter(plan)
    named: _Call | None = None
    try:
        yield event("response.created", response=draft.snapshot("in_progress", []))
        yield event("response.in_progress", response=draft.snapshot("in_progress", []))
        if plan.mode == "named" and plan.name is not None:
            call = Call(new_call_id(), plan.name, "")
            named = _Call(event, call, draft.tools.namespaces.get(plan.name))
            yield named.open()
        async for outputs in handle.batches():
            last = outputs[-1]
            error: FastllmError | None = last.error
            if error is None and last.finished_reason == FinishReason.CANCELLED:
                error = RequestCancelled("the request was cancelled")
            lp = chat_logprobs(texts, sampled_positions(outputs))["content"] if texts else []
            visible = splitter.push("".join(o.text for o in outputs))
            if named is not None and visible:
                yield named.delta(visible)
            elif named is None:
                for chunk in message.push(visible, lp):
                    yield chunk
            if error is not None:
                failure = {"code": _error_code(error), "message": error.message}
                yield event(
                    "response.failed",
                    response=draft.snapshot("failed", event.items, error=failure),
                )
                return
            if last.finished_reason is not None:
                for chunk in _finish(event, draft, message, splitter, named, last.finished_reason):
                    yield chunk
                status = status_of(last.finished_reason)
                snapshot = draft.snapshot(
                    status,
                    event.items,
                    usage=usage(last),
                    completed_at=int(time.time()) if status == "completed" else None,
                )
                if on_final is not None:
                    await on_final(snapshot)
                if last.metrics is not None:  # enable_request_metrics (not stored)
                    snapshot = {**snapshot, "metrics": last.metrics.as_dict()}
                yield event(f"response.{status}", response=snapshot)
                return
    finally:
        if not handle.finished:
            cancel()  # the client went away mid-stream: free the request's KV now


def _finish(
    event: _Sequence,
    draft: Draft,
    message: _Message,
    splitter: Splitter,
    named: _Call | None,
    reason: str,
) -> list[bytes]:
    """The closing events of every output item (see the module doc)."""
    status = status_of(reason)
    if named is not None:
        return named.close(status)
    result = outcome(draft.tools.plan, splitter.text, reason, draft.parallel_tool_calls)
    out: list[bytes] = []
    if not result.calls:
        out.extend(message.push(splitter.rest(), []))
    if result.text is not None or not result.calls:
        out.extend(message.close(status))
    for call in result.calls:
        stream = _Call(event, call, draft.tools.namespaces.get(call.name))
        out.extend([stream.open(), stream.delta(call.arguments), *stream.close(status)])
    return out


def _error_code(error: FastllmError) -> str:
    if error.http_status == 429:
        return "rate_limit_exceeded"
    return "invalid_prompt" if error.http_status == 400 else "server_error"
