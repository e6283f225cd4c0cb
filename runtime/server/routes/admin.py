"""Operator endpoints behind the admin token: the batch policy, the memory report and the
prefix-cache hit rate per tenant."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from runtime.errors import ServiceUnavailable
from runtime.server.auth import require_admin
from runtime.server.errors import ErrorResponse
from runtime.server.state import get_state
from runtime.settings.engine import BatchGoal, band_for

_ADMIN_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "invalid policy"},
    401: {"model": ErrorResponse, "description": "missing admin token"},
    403: {"model": ErrorResponse, "description": "wrong admin token, or admin disabled"},
    503: {"model": ErrorResponse, "description": "the model is not loaded yet"},
}
router = APIRouter(
    prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)], responses=_ADMIN_ERRORS
)


class BatchPolicyRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")  # as the API's bodies

    min_util: float = Field(ge=0.0, le=1.0)
    max_util: float = Field(ge=0.0, le=1.0)
    step_size: float = Field(gt=0.0, le=1.0)


class BatchPolicy(BaseModel):
    min_util: float
    max_util: float
    step_size: float
    engines: list[dict[str, Any]]  # model, version, batch_size_limit


class MemoryReport(BaseModel):
    # one per device: tier stats and the live blocks by owner (the KV page pool as its pages:
    # per request, shared, cached, free)
    allocators: list[dict[str, Any]]
    kv_caches: list[dict[str, Any]]  # one per model version: page counts, prefix-cache counts
    # one per model version: quantization and resident weight bytes by format (int8, int4, fp8
    # or the float dtype)
    weights: list[dict[str, Any]] = []
    # one per model version serving LoRA adapters: resident bytes per adapter, loads, evictions
    loras: list[dict[str, Any]] = []
    # tensor parallelism: one row per rank of each split model (RSS, KV pool, weights); empty
    # without tensor parallelism
    tp_ranks: list[dict[str, Any]] = []


class TenantPrefixCache(BaseModel):
    tenant: str  # key-<n>: the n-th configured API key; "open" without API keys
    requests: int
    prompt_tokens: int
    cached_tokens: int
    hit_ratio: float  # cached_tokens / prompt_tokens


class PrefixCacheReport(BaseModel):
    shared_across_keys: bool  # settings.prefix_cache_shared_across_keys
    tenants: list[TenantPrefixCache]


def _loaded_engines(request: Request) -> list[tuple[str, str, Any]]:
    engines = list(get_state(request).router.engines())
    if not all(engine.is_loaded for _, _, engine in engines):
        raise ServiceUnavailable("the model is not loaded yet", retry_after_s=5.0)
    return engines


@router.post("/batch-policy", response_model=BatchPolicy)
async def set_batch_policy(body: BatchPolicyRequest, request: Request) -> BatchPolicy:
    engines = _loaded_engines(request)
    for _, _, engine in engines:
        engine.set_batch_policy(body.min_util, body.max_util, body.step_size)
    return BatchPolicy(
        min_util=body.min_util,
        max_util=body.max_util,
        step_size=body.step_size,
        engines=[
            {"model": m, "version": v, "batch_size_limit": e.batch_size_limit}
            for m, v, e in engines
        ],
    )


class BatchGoalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    goal: BatchGoal  # latency | balanced | throughput (runtime.settings.engine)


@router.post("/batch-goal", response_model=BatchPolicy)
async def set_batch_goal(body: BatchGoalRequest, request: Request) -> BatchPolicy:
    """The goal's band, with the engines' current step size (`step_up`): the same change as
    POST /admin/batch-policy with that band."""
    engines = _loaded_engines(request)
    min_util, max_util = band_for(body.goal)
    step_size = engines[0][2].batch_policy.step_up
    return await set_batch_policy(
        BatchPolicyRequest(min_util=min_util, max_util=max_util, step_size=step_size), request
    )


@router.get("/memory", response_model=MemoryReport)
async def memory(request: Request) -> MemoryReport:
    seen: set[str] = set()
    allocators, kv_caches, weights, loras = [], [], [], []
    tp_ranks: list[dict[str, Any]] = []
    for model, version, engine in _loaded_engines(request):
        lora = getattr(engine, "lora_stats", lambda: None)()
        if lora is not None:
            loras.append({"model": model, "version": version, **_lora_row(lora)})
        ranks = getattr(engine, "tp_memory", lambda: None)()
        tp_ranks += [{"model": model, "version": version, **row} for row in ranks or []]
        kv = engine.kv_cache_stats()
        kv_caches.append({"model": model, "version": version, **asdict(kv)})
        summary = engine.loaded.quantization
        weights.append(
            {
                "model": model,
                "version": version,
                "quantization": summary.method if summary else "none",
                "group_size": summary.group_size if summary else None,
                "bytes_by_format": engine.weight_bytes(),
            }
        )
        stats = engine.allocator_stats()
        if stats.device in seen:  # engines on one device share its allocator
            continue
        seen.add(stats.device)
        allocators.append(
            {
                "device": stats.device,
                "used_by": f"{model}/{version}",
                "bytes_in_use": stats.bytes_in_use,
                "bytes_cached": stats.bytes_cached,
                "tiers": [asdict(t) for t in stats.tiers],
                "live_blocks": [asdict(b) for b in engine.leak_report()],
            }
        )
    return MemoryReport(
        allocators=allocators, kv_caches=kv_caches, weights=weights, loras=loras, tp_ranks=tp_ranks
    )


def _lora_row(stats: Any) -> dict[str, Any]:
    return {
        "bytes_by_adapter": stats.resident_bytes,  # the allocator blocks, owner lora:<name>
        "registered": stats.registered,
        "loads_total": stats.loads_total,
        "evictions_total": stats.evictions_total,
    }


@router.get("/prefix-cache", response_model=PrefixCacheReport)
async def prefix_cache(request: Request) -> PrefixCacheReport:
    state = get_state(request)
    rows = state.tenants.rows() if state.tenants is not None else []
    return PrefixCacheReport(
        shared_across_keys=state.settings.prefix_cache_shared_across_keys,
        tenants=[TenantPrefixCache(**asdict(r), hit_ratio=round(r.hit_ratio, 6)) for r in rows],
    )
