"""Stored /v1/responses (`store: true`): save, load and delete one response by id, per tenant.

Blocking calls (the server runs them in a worker thread); each is one short transaction. A
response of another tenant is as absent as one never stored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Engine, delete, insert, select

from storage.models import StoredResponse

__all__ = ["ResponseStore", "Stored"]


@dataclass(frozen=True)
class Stored:
    response: dict[str, Any]  # the final response object
    turns: list[dict[str, Any]]  # the conversation it ends: chat turns (role, content, ...)


class ResponseStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def save(
        self,
        response_id: str,
        tenant: str,
        model: str,
        response: dict[str, Any],
        turns: list[dict[str, Any]],
    ) -> None:
        values = {
            "ts": datetime.now(timezone.utc),
            "response_id": response_id,
            "tenant": tenant,
            "model": model,
            "response": json.dumps(response, separators=(",", ":")),
            "turns": json.dumps(turns, separators=(",", ":")),
        }
        with self.engine.begin() as conn:
            conn.execute(insert(StoredResponse), [values])

    def load(self, response_id: str, tenant: str) -> Stored | None:
        query = select(StoredResponse.response, StoredResponse.turns).where(
            StoredResponse.response_id == response_id, StoredResponse.tenant == tenant
        )
        with self.engine.connect() as conn:
            found = conn.execute(query).first()
        if found is None:
            return None
        return Stored(json.loads(found.response), json.loads(found.turns))

    def delete(self, response_id: str, tenant: str) -> bool:
        query = delete(StoredResponse).where(
            StoredResponse.response_id == response_id, StoredResponse.tenant == tenant
        )
        with self.engine.begin() as conn:
            return bool(conn.execute(query).rowcount)
