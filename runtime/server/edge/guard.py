"""The outermost ASGI layer of the API: admission and last-resort error handling.

For every /v1 request (and /tokenize, /detokenize), in this order, it
- checks the API key before anything else (401; counted as reason "unauthorized", never an
  inference_log row: a client without a key must not be able to grow the table);
- refuses while not ready or draining (503 + Retry-After);
- reads the body up front (runtime.server.edge.body): bounded by `max_body_bytes` whether or not a
  Content-Length was sent (413), by `body_read_timeout_s` (408), and cut short by the drain
  (503); a body that is not UTF-8 or whose text holds a lone surrogate is a 400 naming the field
  (runtime.server.edge.body.check_json);
- counts the request as in flight only once its body is in, so the drain waits for requests
  being served, never for a body that does not arrive;
- replays the body to the app (later `receive()` calls go to the server, so a client disconnect
  still reaches the route) and turns any exception nothing else handled into a 500 with the
  error body (failure "internal").
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.server.anthropic.auth import MISSING as MISSING_KEY
from runtime.server.anthropic.errors import anthropic_error, is_messages_path
from runtime.server.auth import api_key_problem, authorization_of
from runtime.server.edge.body import BodyLimits, Refusal, check_json, header, read_body
from runtime.server.errors import error_payload, record_failure
from runtime.server.openai.tokenize import PATHS as TOKENIZER_PATHS

log = logging.getLogger("fastllm.server")


class Guard:
    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if not (path.startswith("/v1/") or path in TOKENIZER_PATHS):
            await self.app(scope, receive, send)
            return
        state = self.state
        authorization = authorization_of(
            path, header(scope, b"authorization"), header(scope, b"x-api-key")
        )
        problem = api_key_problem(authorization, state.settings.api_keys)
        if problem is not None:
            if is_messages_path(path) and problem.startswith("missing"):
                problem = MISSING_KEY  # names x-api-key too
            unauthorized = Refusal(401, problem, "authentication_error", code="invalid_api_key")
            await self._refuse(scope, send, unauthorized)
            return
        if state.drain.is_draining or not state.is_ready:
            why = "shutting down" if state.drain.is_draining else "not ready"
            message = state.load_error or f"the server is {why}; retry later"
            await self._refuse(
                scope, send, Refusal(503, message, "service_unavailable", retry_after=5)
            )
            return
        body = b""
        if scope["method"] in ("POST", "PUT", "PATCH"):
            settings = state.settings
            limits = BodyLimits(settings.max_body_bytes, settings.body_read_timeout_s)
            read = await read_body(scope, receive, limits, lambda: state.drain.is_draining)
            if read is None:  # the client went away before its body was in
                return
            if isinstance(read, Refusal):
                await self._refuse(scope, send, read)
                return
            body = read
            bad_text = _check_text(body)
            if bad_text is not None:
                await self._refuse(scope, send, bad_text)
                return
        if state.drain.is_draining:  # began while the body arrived (no await since the check)
            message = "the server is shutting down; retry later"
            await self._refuse(
                scope, send, Refusal(503, message, "service_unavailable", retry_after=5)
            )
            return
        state.drain.enter()
        try:
            await self._admit(scope, receive, send, body)
        finally:
            state.drain.exit()

    async def _admit(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
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
                refusal = Refusal(500, "internal server error", "internal_error")
                await self._refuse(scope, send, refusal, record=not is_recorded)

    async def _refuse(
        self, scope: Scope, send: Send, refusal: Refusal, *, record: bool = True
    ) -> None:
        if record and scope["method"] == "POST":
            traceparent = header(scope, b"traceparent")
            record_failure(self.state.stats, refusal.status, traceparent=traceparent)
        payload = error_payload(
            refusal.message, refusal.error_type, param=refusal.param, code=refusal.code
        )
        status = refusal.status
        if is_messages_path(scope["path"]):  # Anthropic's shape and statuses on its routes
            status, payload = anthropic_error(status, refusal.message)
        body = json.dumps(payload).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        if refusal.retry_after is not None:
            headers.append((b"retry-after", str(refusal.retry_after).encode()))
        if refusal.status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        if refusal.close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _check_text(body: bytes) -> Refusal | None:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Refusal(400, f"request body is not valid UTF-8 (byte {exc.start})")
    return check_json(body)
