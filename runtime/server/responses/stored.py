"""`store: true`, `previous_response_id`, GET and DELETE /v1/responses/{id}: the server's side of
storage.responses (the database of `storage_enabled`, shared by replicas that share it).

A response is stored with the conversation it ends (the input's chat turns, then the output as
an assistant turn), under the API key's tenant: `previous_response_id` continues that
conversation (the new request's `instructions` replace the old, as OpenAI does), and only the
same tenant reads or deletes it. Retention (`retention_days`) prunes stored responses like every
table. Database calls run in a worker thread; a database that cannot answer is a 503.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.requests import Request

from runtime.errors import FastllmError, InvalidRequestError, ServiceUnavailable
from runtime.server.openai.tenancy import tenant_of
from runtime.server.state import get_state

__all__ = ["ResponseNotFound", "Storage", "assistant_turn", "storage_of"]

T = TypeVar("T")


class ResponseNotFound(FastllmError):
    http_status = 404
    error_type = "invalid_request_error"  # OpenAI's type for an unknown response id


class Storage:
    """One request's view of the store: its tenant, and calls that never block the loop."""

    def __init__(self, store: Any, tenant: str) -> None:
        self.store, self.tenant = store, tenant

    async def _call(self, method: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.to_thread(method, *args)
        except Exception as exc:  # the database is down, or not migrated yet
            raise ServiceUnavailable(f"the response store cannot answer: {exc}") from exc

    async def history(self, response_id: str) -> list[dict[str, Any]]:
        found = await self._call(self.store.load, response_id, self.tenant)
        if found is None:
            raise InvalidRequestError(
                f"previous response {response_id[:128]!r} not found",
                param="previous_response_id",
            )
        return list(found.turns)

    async def get(self, response_id: str) -> dict[str, Any]:
        found = await self._call(self.store.load, response_id, self.tenant)
        if found is None:
            raise ResponseNotFound(f"response {response_id[:128]!r} not found", param="id")
        return dict(found.response)

    async def save(self, response: dict[str, Any], turns: list[dict[str, Any]], model: str) -> None:
        conversation = [*turns, assistant_turn(response["output"])]
        await self._call(
            self.store.save, response["id"], self.tenant, model, response, conversation
        )

    async def delete(self, response_id: str) -> None:
        if not await self._call(self.store.delete, response_id, self.tenant):
            raise ResponseNotFound(f"response {response_id[:128]!r} not found", param="id")


def storage_of(request: Request) -> Storage | None:
    """None when the server has no database (storage_enabled off)."""
    state = get_state(request)
    if state.writer is None:
        return None
    from storage.responses import ResponseStore

    tenant = tenant_of(request.headers.get("authorization"), state.settings.api_keys) or ""
    return Storage(ResponseStore(state.writer.engine), tenant)


def assistant_turn(output: list[dict[str, Any]]) -> dict[str, Any]:
    """The output items as the chat turn a template renders (text, then the calls)."""
    texts = [p["text"] for item in output if item["type"] == "message" for p in item["content"]]
    calls = [
        {"id": item["call_id"], "function": {"name": item["name"], "arguments": item["arguments"]}}
        for item in output
        if item["type"] == "function_call"
    ]
    turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        turn["tool_calls"] = calls
    return turn
