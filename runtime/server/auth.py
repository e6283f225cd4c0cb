"""API keys and the admin token, both sent as `Authorization: Bearer <secret>`.

API keys (settings.api_keys) guard /v1; with none configured the API is open and /openapi.json
declares no security for it. The edge checks the key before it reads a body (`api_key_problem`);
the route dependency documents it in /openapi.json and checks it again. The admin token guards
/admin and is separate: with none configured every admin call is refused (403), a missing token
is 401 and a wrong one 403.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from runtime.errors import AuthenticationError, PermissionDeniedError
from runtime.server.anthropic.errors import is_messages_path

_api_bearer = HTTPBearer(auto_error=False, scheme_name="ApiKey", description="an API key")
_admin_bearer = HTTPBearer(auto_error=False, scheme_name="AdminToken", description="admin token")


def authorization_of(path: str, authorization: str | None, x_api_key: str | None) -> str | None:
    """The `Authorization` value a request's key is read from: on the Messages routes an
    `x-api-key` stands for `Bearer <key>` (Anthropic's clients send it; the OpenAI routes keep
    `Authorization` only)."""
    if x_api_key and is_messages_path(path):
        return f"Bearer {x_api_key}"
    return authorization


def key_index(secret: str, candidates: Sequence[str]) -> int | None:
    """The index of the first candidate equal to `secret`, or None. The one comparison of secrets
    in the server (/v1, /admin, the status page's data, the prefix cache's tenants): every
    candidate is compared (no early exit), each in constant time."""
    found = None
    for i, candidate in enumerate(candidates):
        if secrets.compare_digest(secret.encode(), candidate.encode()) and found is None:
            found = i
    return found


def matches(secret: str, candidates: Sequence[str]) -> bool:
    return key_index(secret, candidates) is not None


def api_key_problem(authorization: str | None, api_keys: Sequence[str]) -> str | None:
    """Why a request with this `Authorization` header is refused, or None when it may pass.
    The edge (runtime.server.edge.guard) asks this before reading the body."""
    if not api_keys:
        return None
    scheme, _, secret = (authorization or "").partition(" ")  # as fastapi's HTTPBearer reads it
    if scheme.lower() != "bearer" or not secret:
        return "missing API key: send `Authorization: Bearer <key>`"
    if not matches(secret, api_keys):
        return "invalid API key"
    return None


def api_key_dependencies(api_keys: Sequence[str]) -> list[Any]:
    """Dependencies for the /v1 router: none when the API is open."""
    keys = tuple(api_keys)
    if not keys:
        return []

    def check_api_key(
        request: Request,
        credentials: HTTPAuthorizationCredentials | None = Security(_api_bearer),
    ) -> None:
        if credentials is None:
            raise AuthenticationError(
                "missing API key: send `Authorization: Bearer <key>`", code="invalid_api_key"
            )
        if not matches(credentials.credentials, keys):
            raise AuthenticationError("invalid API key", code="invalid_api_key")

    return [Depends(check_api_key)]


def require_admin(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None = Security(_admin_bearer),
) -> None:
    token = request.app.state.fastllm.settings.admin_token
    if not token:
        raise PermissionDeniedError(
            "admin endpoints are disabled: no admin_token is configured", code="admin_disabled"
        )
    if credentials is None:
        raise AuthenticationError(
            "missing admin token: send `Authorization: Bearer <token>`", code="missing_token"
        )
    if not matches(credentials.credentials, (token,)):
        raise PermissionDeniedError("invalid admin token", code="invalid_token")
