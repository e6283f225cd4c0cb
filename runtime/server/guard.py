"""The outermost ASGI layer of the API: admission and last-resort error handling.

For every /v1 request it
- refuses while not ready or draining (503 + Retry-After) and counts what is in flight, so the
  drain knows when the last streamed byte has left;
- reads the body up front, bounded by `max_body_bytes` whether or not a Content-Length was sent
  (413), and refuses a body that is not UTF-8 (400); the body is then replayed to the app, and
  later `receive()` calls go to the server, so a client disconnect still reaches the route;
- turns any exception nothing else handled into a 500 with the error body (failure "internal").
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.server.errors import error_payload, record_failure

log = logging.getLogger("fastllm.server")


class Guard:
    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        state = self.state
        if state.drain.is_draining or not state.is_ready:
            why = "shutting down" if state.drain.is_draining else "not ready"
            message = state.load_error or f"the server is {why}; retry later"
            await self._refuse(scope, send, 503, message, "service_unavailable", retry_after=5)
            return
        state.drain.enter()
        try:
            await self._admit(scope, receive, send)
        finally:
            state.drain.exit()

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        if scope["method"] in ("POST", "PUT", "PATCH"):
            limit = self.state.settings.max_body_bytes
            declared = _content_length(scope)
            if declared is not None and declared > limit:
                await self._too_large(scope, send, limit)
                return
            chunks, size, more = [], 0, True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    await self._too_large(scope, send, limit)
                    return
                chunks.append(chunk)
                more = message.get("more_body", False)
            body = b"".join(chunks)
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as exc:
                message_text = f"request body is not valid UTF-8 (byte {exc.start})"
                await self._refuse(scope, send, 400, message_text, "invalid_request_error")
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, replay, tracking_send)
        except Exception:
            log.exception("unhandled error in %s %s", scope["method"], scope["path"])
            if not started:
                # the engine already recorded an admitted request's failure
                is_recorded = bool(scope.get("state", {}).get("engine_recorded"))
                await self._refuse(
                    scope,
                    send,
                    500,
                    "internal server error",
                    "internal_error",
                    record=not is_recorded,
                )

    async def _too_large(self, scope: Scope, send: Send, limit: int) -> None:
        message = f"request body exceeds max_body_bytes ({limit} bytes)"
        await self._refuse(scope, send, 413, message, "invalid_request_error", code="too_large")

    async def _refuse(
        self,
        scope: Scope,
        send: Send,
        status: int,
        message: str,
        error_type: str,
        *,
        retry_after: int | None = None,
        record: bool = True,
        code: str | None = None,
    ) -> None:
        if record and scope["method"] == "POST":
            traceparent = _header(scope, b"traceparent")
            record_failure(self.state.stats, status, traceparent=traceparent)
        body = json.dumps(error_payload(message, error_type, code=code)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        if retry_after is not None:
            headers.append((b"retry-after", str(retry_after).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
