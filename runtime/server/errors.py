"""Every error leaves the server as `{"error": {"message", "type", "param", "code"}}`.

Typed `FastllmError`s carry their own status; request-body validation becomes a 400 (never
FastAPI's 422); unknown routes / methods keep their 404 / 405 in the same shape. Each failed API
request is recorded once as a `RequestStats` with a `failure_reason`, except those the engine
already recorded (admitted requests and its own Overloaded refusals; see runtime.engine.engine).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import Match

from runtime.engine.stats import FailureReason, FanOut, RequestStats
from runtime.errors import FastllmError, Overloaded, ServiceUnavailable
from runtime.server.anthropic.errors import anthropic_error, is_messages_path
from runtime.server.openai.schemas import ErrorResponse
from runtime.server.openai.unsupported import UNSUPPORTED

_HTTP_TYPES = {404: "not_found_error", 405: "invalid_request_error"}

# statuses every API route may answer besides its 200, documented in /openapi.json
ERROR_STATUSES = {
    400: "invalid request: bad JSON or UTF-8, wrong types, out-of-range values, prompt too long, "
    "an OpenAI field this server does not support",
    401: "missing or invalid API key",
    408: "the request body did not arrive within body_read_timeout_s",
    404: "unknown model",
    413: "request body larger than max_body_bytes",
    429: "overloaded; retry after the Retry-After seconds",
    500: "internal error",
    503: "not ready, shutting down or the model failed to load; see Retry-After",
    504: "the request ran past its deadline",
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text} for status, text in ERROR_STATUSES.items()
}


def failure_reason(status: int) -> FailureReason:
    if status == 504:
        return FailureReason.TIMEOUT
    if status in (429, 503):
        return FailureReason.OVERLOADED
    if status in (401, 403):
        return FailureReason.UNAUTHORIZED  # counted, never an inference_log row (storage.writer)
    return FailureReason.VALIDATION if status < 500 else FailureReason.INTERNAL


def error_payload(
    message: str, error_type: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(exc: FastllmError) -> JSONResponse:
    headers = {}
    if isinstance(exc, Overloaded | ServiceUnavailable):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    payload = error_payload(exc.message, exc.error_type, param=exc.param, code=exc.code)
    return JSONResponse(payload, status_code=exc.http_status, headers=headers)


def record_failure(
    stats: FanOut,
    status: int,
    *,
    request_id: str | None = None,
    model: str = "",
    operation: str = "text_completion",
    traceparent: str | None = None,
) -> None:
    now = time.time()
    stats.record(
        finished=[
            RequestStats(
                request_id=request_id or f"req-{uuid.uuid4().hex}",
                model=model,
                queued_ts=now,
                finished_ts=now,
                failure_reason=failure_reason(status),
                operation=operation,
                traceparent=traceparent,
            )
        ]
    )


def record_request_failure(request: Request, status: int) -> None:
    """Record a failed API request unless the engine already did (see the module doc)."""
    if not request.url.path.startswith("/v1/") or request.method != "POST":
        return
    if getattr(request.state, "engine_recorded", False):
        return
    request.state.engine_recorded = True  # once per request
    record_failure(
        request.app.state.fastllm.stats,
        status,
        request_id=getattr(request.state, "request_id", None),
        model=getattr(request.state, "model", ""),
        operation=getattr(request.state, "operation", None) or _operation(request.url.path),
        traceparent=request.headers.get("traceparent"),
    )


def _operation(path: str) -> str:
    if path.endswith("/chat/completions"):
        return "chat"
    if is_messages_path(path):
        return "messages"
    if path.startswith("/v1/responses"):
        return "responses"
    return "embeddings" if path.endswith("/embeddings") else "text_completion"


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request body", None
    if errors[0].get("type") == "json_invalid":
        return f"request body is not valid JSON: {errors[0].get('msg', '')}", None
    first = _most_telling(errors)
    loc = [str(part) for part in first.get("loc", ()) if part != "body" and not _is_tag(part)]
    ctx = first.get("ctx") or {}
    if first.get("type") == UNSUPPORTED and "field" in ctx:  # refused OpenAI fields
        return str(first.get("msg")), str(ctx["field"])
    where = ".".join(loc) or "body"
    param = loc[0] if loc else None
    return f"{where}: {first.get('msg', 'invalid value')}", param


def _most_telling(errors: Sequence[Any]) -> Any:
    """The error to report, among those of the first field. A union (`stop`: a string or a list
    of strings) fails once per member; "Input should be a valid string" from the member the
    value is not says nothing, the other member's "at most 4 items" does."""
    field = _field(errors[0])
    same = [e for e in errors if _field(e) == field]
    return min(same, key=lambda e: (str(e.get("type", "")).endswith("_type"), -len(e["loc"])))


def _field(error: Any) -> Any:
    loc = [part for part in error.get("loc", ()) if part != "body"]
    return loc[0] if loc else None


def _is_tag(part: Any) -> bool:
    # pydantic names union members in `loc` ("constrained-str", "list[constrained-str]"); field
    # names and list indexes are identifiers and ints
    return isinstance(part, str) and not part.isidentifier()


def _shaped(request: Request, response: JSONResponse, message: str) -> JSONResponse:
    """The OpenAI-shaped `response`, or on the Messages routes Anthropic's (same headers)."""
    if not is_messages_path(request.url.path):
        return response
    status, payload = anthropic_error(response.status_code, message)
    headers = {k: v for k, v in response.headers.items() if k.lower() == "retry-after"}
    if "allow" in response.headers:
        headers["Allow"] = response.headers["allow"]
    return JSONResponse(payload, status_code=status, headers=headers or None)


async def _on_fastllm_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FastllmError)
    record_request_failure(request, exc.http_status)
    return _shaped(request, error_response(exc), exc.message)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, param = _validation_message(exc)
    body = exc.body
    model = body.get("model") if isinstance(body, dict) else None
    if isinstance(model, str) and model.isprintable() and _is_utf8(model):
        request.state.model = model[:256]  # the metrics sink maps unserved names to "unknown"
    record_request_failure(request, 400)
    payload = error_payload(message, "invalid_request_error", param=param)
    return _shaped(request, JSONResponse(payload, status_code=400), message)


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    record_request_failure(request, exc.status_code)  # e.g. a body FastAPI could not parse
    error_type = _HTTP_TYPES.get(exc.status_code, "invalid_request_error")
    payload = error_payload(str(exc.detail), error_type)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:  # starlette names the methods of the first route of the path only
        headers["Allow"] = ", ".join(_methods_at(request))
    response = JSONResponse(payload, status_code=exc.status_code, headers=headers or None)
    return _shaped(request, response, str(exc.detail))


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def _methods_at(request: Request) -> list[str]:
    """The methods some route serves at this path (asked of the router, method by method, so
    routes of included routers count too)."""
    routes = request.app.router.routes
    return [
        method
        for method in _METHODS
        if any(r.matches({**request.scope, "method": method})[0] == Match.FULL for r in routes)
    ]


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(FastllmError, _on_fastllm_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_error)
