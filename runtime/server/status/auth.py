"""Who may read the status page's data, sent as `Authorization: Bearer <secret>`:

- with API keys configured, its JSON endpoints (`/status/api/*`, `/api/v1/query*`) need one of
  them, or the admin token, exactly as /v1 does (401 otherwise); with none configured they are
  open, like /metrics. The HTML and its scripts at `/` hold no data and are always served.
- details that name owners or requests (memory owners, the audit's worst rows) need the admin
  token; without it the page shows totals only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request, Security
from fastapi.security import HTTPBearer

from runtime.errors import AuthenticationError
from runtime.server.auth import matches
from runtime.server.state import get_state

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="StatusViewer",
    description="an API key (when keys are configured) or the admin token (owner details)",
)


@dataclass(frozen=True)
class Viewer:
    is_admin: bool  # sent the admin token: owner and request details are shown


def status_viewer(request: Request) -> Viewer:
    """The header is read here, not through a declared security scheme: with no API keys the
    data is open and /openapi.json must not claim otherwise (`documented_security` adds the
    declaration when keys are configured)."""
    settings = get_state(request).settings
    scheme, _, secret = request.headers.get("authorization", "").partition(" ")
    token = secret.strip() if scheme.lower() == "bearer" and secret.strip() else None
    admin = settings.admin_token
    is_admin = bool(admin) and token is not None and matches(token, (str(admin),))
    if settings.api_keys and not is_admin:
        if token is None:
            raise AuthenticationError(
                "missing API key: send `Authorization: Bearer <key>`", code="invalid_api_key"
            )
        if not matches(token, settings.api_keys):
            raise AuthenticationError("invalid API key", code="invalid_api_key")
    return Viewer(is_admin=is_admin)


def documented_security(api_keys: Sequence[str]) -> list[Any]:
    """Router dependencies that only declare the bearer scheme in /openapi.json (with keys)."""
    return [Security(_bearer)] if api_keys else []
