"""The API key on the Messages routes: Anthropic's clients send `x-api-key` (the `anthropic` SDK,
Claude Code with ANTHROPIC_API_KEY) or `Authorization: Bearer` (ANTHROPIC_AUTH_TOKEN). Either
names the same configured key, hence the same tenant (runtime.server.openai.tenancy); with both,
`x-api-key` counts. The OpenAI routes keep `Authorization` only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from runtime.errors import AuthenticationError
from runtime.server.auth import authorization_of, matches

__all__ = ["authorization_of", "messages_key_dependencies"]

_x_api_key = APIKeyHeader(name="x-api-key", auto_error=False, scheme_name="XApiKey")
_bearer = HTTPBearer(auto_error=False, scheme_name="ApiKey", description="an API key")
MISSING = "missing API key: send `x-api-key: <key>` or `Authorization: Bearer <key>`"


def messages_key_dependencies(api_keys: Sequence[str]) -> list[Any]:
    """Dependencies for the Messages router: none when the API is open."""
    keys = tuple(api_keys)
    if not keys:
        return []

    def check_api_key(
        request: Request,
        x_api_key: str | None = Security(_x_api_key),
        credentials: HTTPAuthorizationCredentials | None = Security(_bearer),
    ) -> None:
        secret = x_api_key or (credentials.credentials if credentials is not None else None)
        if not secret:
            raise AuthenticationError(MISSING, code="invalid_api_key")
        if not matches(secret, keys):
            raise AuthenticationError("invalid API key", code="invalid_api_key")

    return [Depends(check_api_key)]
