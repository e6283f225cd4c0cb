"""What /openapi.json documents for the Messages routes: the response bodies and the error
statuses, in Anthropic's shape (errors.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    type: Literal["error"] = "error"
    error: ErrorDetail


class Usage(BaseModel):
    input_tokens: int  # prompt tokens computed for this request
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0  # prompt tokens the prefix cache supplied


class ContentBlock(BaseModel):
    type: Literal["text", "tool_use"]
    text: str | None = None  # text blocks
    id: str | None = None  # tool_use blocks: toolu_...
    name: str | None = None
    input: dict[str, Any] | None = None


class MessageResponse(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None = None
    usage: Usage


class CountTokens(BaseModel):
    input_tokens: int


_ERRORS = {
    400: "invalid_request_error: bad JSON, wrong types, unsupported blocks, prompt too long",
    401: "authentication_error: missing or invalid API key (x-api-key or Authorization: Bearer)",
    404: "not_found_error: unknown model",
    408: "timeout_error: the body did not arrive within body_read_timeout_s",
    413: "request_too_large: body larger than max_body_bytes",
    500: "api_error: internal error",
    504: "timeout_error: the request ran past its deadline",
    529: "overloaded_error: the engine is overloaded, not ready or shutting down (Retry-After)",
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text} for status, text in _ERRORS.items()
}
COUNT_RESPONSES = ERROR_RESPONSES
MESSAGE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    200: {
        "description": "the message, or with `stream: true` server-sent events",
        "content": {
            "text/event-stream": {
                # one server-sent event: `event` names its type, `data` is its JSON
                "schema": {
                    "type": "object",
                    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
                    "required": ["data"],
                }
            }
        },
    },
}
