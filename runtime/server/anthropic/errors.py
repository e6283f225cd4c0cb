"""Anthropic's error shape for the Messages routes: `{"type": "error", "error": {"type",
"message"}}`, with Anthropic's status codes. The OpenAI routes keep their own shape: the server's
error handlers and the edge ask `is_messages_path` and come here for these paths only.

The server's overload refusals (the engine's admission queue, not ready, draining) answer 529
`overloaded_error`, as Anthropic does when it cannot take a request now; a client retries both.
The failure is still recorded with the server's own status (429 / 503: reason "overloaded").
"""

from __future__ import annotations

from typing import Any

__all__ = ["MESSAGES_PATH", "anthropic_error", "error_body", "is_messages_path"]

MESSAGES_PATH = "/v1/messages"
OVERLOADED_STATUS = 529  # Anthropic's "overloaded_error" status

# the server's status -> (Anthropic's status, error type)
_BY_STATUS: dict[int, tuple[int, str]] = {
    400: (400, "invalid_request_error"),
    401: (401, "authentication_error"),
    403: (403, "permission_error"),
    404: (404, "not_found_error"),
    405: (405, "invalid_request_error"),
    408: (408, "timeout_error"),
    409: (409, "invalid_request_error"),
    413: (413, "request_too_large"),
    429: (OVERLOADED_STATUS, "overloaded_error"),
    499: (499, "invalid_request_error"),  # the client went away: nobody reads it
    503: (OVERLOADED_STATUS, "overloaded_error"),
    504: (504, "timeout_error"),
}


def is_messages_path(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


def anthropic_error(status: int, message: str) -> tuple[int, dict[str, Any]]:
    """(status, body) Anthropic answers for the server's `status`."""
    new_status, error_type = _BY_STATUS.get(status, (status, "api_error"))
    if status >= 500 and status not in _BY_STATUS:
        new_status = 500
    return new_status, error_body(error_type, message)
