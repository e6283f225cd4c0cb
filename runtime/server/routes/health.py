"""Liveness, readiness and the Prometheus scrape endpoint."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from runtime.server.state import get_state

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str  # "ready" | "loading" | "draining" | "failed"
    detail: str | None = None


@router.get("/health", response_model=Health)
async def health() -> Health:
    """The process is alive (says nothing about the model)."""
    return Health(status="ok")


@router.get(
    "/ready",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "not ready: loading, failed or draining"}},
)
async def ready(request: Request) -> Response | Readiness:
    state = get_state(request)
    if state.is_ready and not state.drain.is_leaving:
        return Readiness(status="ready")
    if state.drain.is_leaving or state.drain.is_draining:
        body = Readiness(status="draining")
    elif state.load_error is not None:
        body = Readiness(status="failed", detail=state.load_error)
    else:
        body = Readiness(status="loading")
    return JSONResponse(body.model_dump(), status_code=503, headers={"Retry-After": "5"})


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
)
async def metrics(request: Request) -> Response:
    """This app's own registry (not the process-global one), Prometheus text format."""
    body = generate_latest(get_state(request).registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
