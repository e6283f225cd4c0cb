"""Canary rollout admin endpoints (behind the admin token), used by `fastllm rollout`.

GET  /admin/rollout?model=M                      status: versions, weight, health per version
POST /admin/rollout {"action": "set", "weight": 0.5[, "model": M]}
POST /admin/rollout {"action": "promote" | "rollback"[, "model": M]}
POST /admin/rollout/sync                         a peer decided something: sync with peers now
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from runtime.errors import ConflictError
from runtime.server.auth import require_admin
from runtime.server.errors import ErrorResponse
from runtime.serving.rollout import RolloutController

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "invalid action or weight"},
    401: {"model": ErrorResponse, "description": "missing admin token"},
    403: {"model": ErrorResponse, "description": "wrong admin token, or admin disabled"},
    404: {"model": ErrorResponse, "description": "unknown model"},
    409: {"model": ErrorResponse, "description": "the model has no canary version"},
}
router = APIRouter(
    prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)], responses=_ERRORS
)


class SetWeight(BaseModel):
    action: Literal["set"]
    weight: float = Field(ge=0.0, le=1.0, description="share of requests for the canary")
    model: str | None = Field(None, description="default: the model that has a canary")


class PromoteOrRollback(BaseModel):
    action: Literal["promote", "rollback"]
    model: str | None = Field(None, description="default: the model that has a canary")


RolloutRequest = Annotated[SetWeight | PromoteOrRollback, Field(discriminator="action")]


class VersionStatus(BaseModel):
    version: str
    role: str  # "stable" | "canary"
    num_requests: int  # in the rollout window
    error_rate: float
    num_verified: int
    anomaly_rate: float


class RolloutStatus(BaseModel):
    model: str
    stable: str
    canary: str | None
    canary_weight: float
    versions: list[VersionStatus]
    last_event: dict[str, Any] | None = None


def controller_of(request: Request) -> RolloutController:
    controller: RolloutController = request.app.state.rollout
    return controller


def _model(controller: RolloutController, model: str | None) -> str:
    if model is not None:
        controller.router.route_of(model)  # 404 for an unknown name
        return model
    with_canary = [m for m, r in controller.router.routes.items() if r.canary is not None]
    if len(with_canary) == 1:
        return with_canary[0]
    if not with_canary and len(controller.router.routes) >= 1:
        return next(iter(controller.router.routes))
    raise ConflictError("several models have a canary: name one with `model`", param="model")


def _status(controller: RolloutController, model: str) -> RolloutStatus:
    route = controller.router.route_of(model)
    versions = []
    for role, version in (("stable", route.stable), ("canary", route.canary)):
        if version is None:
            continue
        h = controller.health(model, version.name)
        versions.append(
            VersionStatus(
                version=version.name,
                role=role,
                num_requests=h.num_requests,
                error_rate=h.error_rate,
                num_verified=h.num_verified,
                anomaly_rate=h.anomaly_rate,
            )
        )
    event = controller.last_events.get(model)
    last = None
    if event is not None:
        last = {
            k: getattr(event, k)
            for k in (
                "action",
                "reason",
                "automatic",
                "detail",
                "stable",
                "canary",
                "canary_weight",
                "delta",
                "ts",
                "origin",
            )
        }
    return RolloutStatus(
        model=model,
        stable=route.stable.name,
        canary=route.canary.name if route.canary else None,
        canary_weight=route.canary_weight,
        versions=versions,
        last_event=last,
    )


@router.get("/rollout", response_model=RolloutStatus)
async def rollout_status(request: Request, model: str | None = None) -> RolloutStatus:
    controller = controller_of(request)
    return _status(controller, _model(controller, model))


@router.post("/rollout", response_model=RolloutStatus)
async def rollout_action(body: RolloutRequest, request: Request) -> RolloutStatus:
    controller = controller_of(request)
    model = _model(controller, body.model)
    if controller.router.route_of(model).canary is None:
        raise ConflictError(f"model {model!r} has no canary version", param="model")
    if isinstance(body, SetWeight):
        controller.set_weight(model, body.weight)
    elif body.action == "promote":
        controller.promote(model)
    else:
        controller.rollback(model)
    return _status(controller, model)


class SyncAccepted(BaseModel):
    status: str  # "syncing" | "no peers"


@router.post("/rollout/sync", response_model=SyncAccepted, status_code=202)
async def rollout_sync(request: Request) -> SyncAccepted:
    """Run a rollout sync round now (runtime/serving/rollout_sync.py); answers before it runs."""
    sync = getattr(request.app.state, "rollout_sync", None)
    if sync is None:
        return SyncAccepted(status="no peers")
    sync.nudge()
    return SyncAccepted(status="syncing")
