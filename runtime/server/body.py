"""Reading a request body at the edge, bounded in size and in time.

`read_body` returns the whole body, a `Refusal` to answer instead, or None when the client went
away. A body larger than `max_body_bytes` (declared or not) is 413; one not received in full
within `body_read_timeout_s` is 408; one still arriving when the drain starts is 503. The last two
close the connection (the rest of the body is never read), so a slow or stalled client holds
neither a worker nor the drain.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import Message, Receive, Scope

POLL_S = 0.1  # how often a pending read looks at the drain flag and the deadline


@dataclass(frozen=True)
class Refusal:
    """An answer the edge gives instead of passing the request on."""

    status: int
    message: str
    error_type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    retry_after: int | None = None  # seconds, for Retry-After
    close: bool = False  # Connection: close (what is left of the body is never read)


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int
    deadline_s: float


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _content_length(scope: Scope) -> int | None:
    value = header(scope, b"content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def too_large(limit: int) -> Refusal:
    message = f"request body exceeds max_body_bytes ({limit} bytes)"
    return Refusal(413, message, code="too_large")


async def read_body(
    scope: Scope, receive: Receive, limits: BodyLimits, is_draining: Callable[[], bool]
) -> bytes | Refusal | None:
    declared = _content_length(scope)
    if declared is not None and declared > limits.max_bytes:
        return too_large(limits.max_bytes)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.deadline_s
    chunks: list[bytes] = []
    size, more = 0, True
    while more:
        if is_draining():
            message = "the server is shutting down; retry later"
            return Refusal(503, message, "service_unavailable", retry_after=5, close=True)
        now = loop.time()
        if now >= deadline:
            message = (
                f"request body not received within body_read_timeout_s ({limits.deadline_s:g} s)"
            )
            return Refusal(408, message, "timeout_error", code="body_timeout", close=True)
        # a body already received comes back at once; a stalled one wakes every POLL_S (its
        # receive() is cancelled and awaited again: the server's receive is a wait on an event)
        received = await _receive_until(receive, min(deadline, now + POLL_S))
        if received is None:
            continue
        if received["type"] == "http.disconnect":
            return None
        chunk = received.get("body", b"")
        size += len(chunk)
        if size > limits.max_bytes:
            return too_large(limits.max_bytes)
        chunks.append(chunk)
        more = received.get("more_body", False)
    return b"".join(chunks)


async def _receive_until(receive: Receive, when: float) -> Message | None:
    """The next message, or None when the loop's clock reaches `when` first."""
    if sys.version_info >= (3, 11):  # a timer, no task per message
        try:
            async with asyncio.timeout_at(when):
                return await receive()
        except TimeoutError:
            return None
    try:
        return await asyncio.wait_for(receive(), max(0.0, when - asyncio.get_running_loop().time()))
    except asyncio.TimeoutError:
        return None
