"""LoRA adapters at run time, as vLLM spells them: `POST /v1/load_lora_adapter` and
`POST /v1/unload_lora_adapter` (`{"lora_name", "lora_path"}`), then `model: <lora_name>` in any
generation request selects the adapter; `/v1/models` lists it with its `parent`.

Who may call them: with `admin_token` configured, the admin token, as `X-Admin-Token` or (when
no API keys are configured, so `Authorization` is free) `Authorization: Bearer`; without one,
whoever may call /v1 (the API keys, if any: the edge guard checks them). Adapters load on every
version (stable, canary) of the parent model, or on none: a failed load on one is rolled back.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, ConfigDict, Field

from runtime.errors import ConflictError, InvalidRequestError, ServiceUnavailable
from runtime.server.auth import require_admin
from runtime.server.errors import ERROR_RESPONSES, ErrorResponse
from runtime.server.state import get_state

__all__ = ["router"]


def _authorize(request: Request) -> None:
    settings = get_state(request).settings
    if not settings.admin_token:
        return  # the edge guard already checked the API key, if any
    header = request.headers.get("x-admin-token")
    if header is None and not settings.api_keys:
        authorization = request.headers.get("authorization", "")
        scheme, _, token = authorization.partition(" ")
        header = token.strip() if scheme.lower() == "bearer" else None
    credentials = (
        None
        if header is None
        else HTTPAuthorizationCredentials(scheme="Bearer", credentials=header)
    )
    require_admin(request, credentials)


_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    403: {"model": ErrorResponse, "description": "wrong admin token"},
    409: {"model": ErrorResponse, "description": "the name is already served"},
}
router = APIRouter(
    prefix="/v1", tags=["lora"], dependencies=[Depends(_authorize)], responses=_ERRORS
)


class LoadLoraRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")
    lora_path: str = Field(min_length=1, max_length=4096)
    # extension: the served model to load it on (default: the main model)
    base_model_name: str | None = None


class UnloadLoraRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1, max_length=128)
    lora_int_id: int | None = None  # vLLM's field; accepted and ignored (names identify here)


class LoraAdapterCard(BaseModel):
    object: str = "lora_adapter"
    id: str
    parent: str
    status: str  # loaded | unloaded
    bytes: int = 0  # resident bytes (allocator block) per engine it was loaded on


def _engines(request: Request, parent: str) -> list[Any]:
    route = get_state(request).router.route_of(parent)
    engines = [version.engine for version in route.versions]
    for engine in engines:
        if getattr(engine, "load_lora", None) is None:
            raise InvalidRequestError(
                f"model {parent!r} cannot serve LoRA adapters (replicated engines)",
                param="base_model_name",
                code="lora_unsupported",
            )
        if not engine.is_loaded:
            raise ServiceUnavailable("the model is not loaded yet", retry_after_s=5.0)
    return engines


@router.post("/load_lora_adapter", response_model=LoraAdapterCard)
async def load_lora_adapter(body: LoadLoraRequest, request: Request) -> LoraAdapterCard:
    state = get_state(request)
    parent = body.base_model_name or state.settings.served_model_name
    engines = _engines(request, parent)
    router = state.router
    if body.lora_name in router.routes or body.lora_name in router.adapters:
        raise ConflictError(f"model name {body.lora_name!r} is already served", param="lora_name")
    done: list[Any] = []
    nbytes = 0
    try:
        for engine in engines:  # reads the files: off the event loop
            nbytes = await asyncio.to_thread(engine.load_lora, body.lora_name, body.lora_path)
            done.append(engine)
        router.add_adapter(body.lora_name, parent)
    except BaseException:
        for engine in done:
            engine.unload_lora(body.lora_name)
        raise
    return LoraAdapterCard(id=body.lora_name, parent=parent, status="loaded", bytes=nbytes)


@router.post("/unload_lora_adapter", response_model=LoraAdapterCard)
async def unload_lora_adapter(body: UnloadLoraRequest, request: Request) -> LoraAdapterCard:
    router = get_state(request).router
    parent = router.remove_adapter(body.lora_name)  # new requests stop selecting it first
    for engine in _engines(request, parent):
        engine.unload_lora(body.lora_name)
    return LoraAdapterCard(id=body.lora_name, parent=parent, status="unloaded")
