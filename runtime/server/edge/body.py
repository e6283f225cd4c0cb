"""Reading a request body at the edge, bounded in size and in time.

`read_body` returns the whole body, a `Refusal` to answer instead, or None when the client went
away. A body larger than `max_body_bytes` (declared or not) is 413; one not received in full
within `body_read_timeout_s` is 408; one still arriving when the drain starts is 503. The last two
close the connection (the rest of the body is never read), so a slow or stalled client holds
neither a worker nor the drain.

`check_json`: text is validated once, at the edge: a JSON body whose strings are not valid
Unicode text (a lone surrogate escape such as "\\ud800", which UTF-8 cannot encode) is refused
with a 400 naming the field, before any of it reaches the tokenizer, a metric label, a span
attribute or an inference_log row.

The usual body costs one memchr: a lone surrogate needs a `\\uD800`-`\\uDFFF` escape in the raw
bytes (they are valid UTF-8 by then), so only a body with a backslash is searched for one, and
only one with such an escape is parsed and walked (then nesting deeper than MAX_JSON_DEPTH is
refused too). Deeper nesting elsewhere is FastAPI's to refuse (its parser raises, a counted 400).
A body that is not JSON at all is left to FastAPI, which answers it with its own 400.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


MAX_JSON_DEPTH = 64  # the API's bodies nest 4 deep (messages[i].content); this is generous
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def check_json(body: bytes) -> Refusal | None:
    if b"\\" not in body or _SURROGATE_ESCAPE.search(body) is None:
        return None
    try:
        document = json.loads(body)
    except RecursionError:  # deeper than the parser's own stack
        return _too_deep()
    except ValueError:  # not JSON: FastAPI says so
        return None
    return _walk(document)


def _too_deep() -> Refusal:
    return Refusal(400, f"request body nests deeper than {MAX_JSON_DEPTH} levels")


def _walk(document: Any) -> Refusal | None:
    """Iterative (a deep document must not exhaust the stack here either)."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(document, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_JSON_DEPTH:
            return _too_deep()
        if isinstance(value, str):
            if not _is_text(value):
                return _not_text(path)
        elif isinstance(value, dict):
            for key, item in value.items():
                if not _is_text(key):
                    return _not_text(path, key="a key")
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, str(i))) for i, item in enumerate(value))
    return None


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_text(path: tuple[str, ...], *, key: str | None = None) -> Refusal:
    where = ".".join(path) or "body"
    what = f"{key} of {where}" if key else where
    message = f"{what}: text must be valid Unicode (it holds a lone surrogate escape, e.g. \\ud800)"
    return Refusal(400, message, param=path[0] if path else None)
