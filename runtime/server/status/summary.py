"""The status page's facts that are not time series: what is served (model, version, canary
weight, batch limit and band, device, uptime), memory totals and, for the admin, who holds it.
Alerts and the audit are in runtime.server.status.facts. Everything is a plain dataclass; the
route turns it into JSON."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from runtime.models.loader import resolve_device
from runtime.server.state import ServerState

NUM_OWNERS = 10  # the largest holders listed to the admin


@dataclass(frozen=True)
class ServedVersion:
    model: str
    version: str
    canary_weight: float  # the share of traffic this version gets (stable: 1 - canary's)
    is_loaded: bool
    batch_size_limit: int | None  # None until loaded
    min_util: float | None  # the controller's band now (set_batch_policy moves it)
    max_util: float | None
    # the last idle self-check (runtime.engine.self_check): None before the first
    kv_leaked_pages: int | None = None
    allocator_orphan_blocks: int | None = None
    # LoRA adapters (runtime.engine.lora): registered names and those resident; None: none
    lora_registered: list[str] | None = None
    lora_resident: list[str] | None = None
    # tensor parallelism: each rank's memory; None: one process
    tp_ranks: list[RankMemory] | None = None


@dataclass(frozen=True)
class RankMemory:
    """One tensor-parallel rank of a split model (runtime.engine.tp.world.RankMemory, less its
    pid): resident memory of its process (None: a worker started elsewhere), its KV pool and
    weights."""

    rank: int
    alive: bool
    rss_bytes: int | None
    kv_pool_bytes: int
    weight_bytes: int


@dataclass(frozen=True)
class Owner:
    owner: str  # request id or subsystem
    num_blocks: int
    reserved_bytes: int
    oldest_age_s: float


@dataclass(frozen=True)
class DeviceMemory:
    device: str
    bytes_in_use: int
    bytes_cached: int
    live_blocks: int
    # the largest holders; None unless the viewer sent the admin token (owners name requests)
    owners: list[Owner] | None = None


@dataclass(frozen=True)
class ServerInfo:
    package_version: str
    device: str
    started_at: float  # unix seconds
    uptime_s: float
    now: float  # the server's clock: the page aligns its windows on it
    is_ready: bool
    load_error: str | None
    versions: list[ServedVersion] = field(default_factory=list)
    memory: list[DeviceMemory] = field(default_factory=list)


def _package_version() -> str:
    try:
        return metadata.version("fastllm-stack")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def served_versions(state: ServerState) -> list[ServedVersion]:
    out = []
    for route in state.router.routes.values():
        for version in route.versions:
            engine = version.engine
            weight = route.canary_weight
            share = weight if version is route.canary else 1.0 - weight
            policy = engine.batch_policy if engine.is_loaded else None
            check = getattr(engine, "self_check_result", lambda: None)()
            lora = getattr(engine, "lora_stats", lambda: None)() if engine.is_loaded else None
            ranks = getattr(engine, "tp_memory", lambda: None)() if engine.is_loaded else None
            out.append(
                ServedVersion(
                    model=route.model,
                    version=version.name,
                    canary_weight=share,
                    is_loaded=engine.is_loaded,
                    batch_size_limit=engine.batch_size_limit if engine.is_loaded else None,
                    min_util=policy.min_util if policy else None,
                    max_util=policy.max_util if policy else None,
                    kv_leaked_pages=check.leaked_pages if check else None,
                    allocator_orphan_blocks=check.orphan_blocks if check else None,
                    lora_registered=lora.registered if lora and lora.registered else None,
                    lora_resident=sorted(lora.resident_bytes) if lora and lora.registered else None,
                    tp_ranks=[_rank(r) for r in ranks] if ranks else None,
                )
            )
    return out


def _rank(row: dict[str, Any]) -> RankMemory:
    return RankMemory(
        row["rank"], row["alive"], row["rss_bytes"], row["kv_pool_bytes"], row["weight_bytes"]
    )


def _owners(blocks: list[Any]) -> list[Owner]:
    count: dict[str, int] = defaultdict(int)
    reserved: dict[str, int] = defaultdict(int)
    oldest: dict[str, float] = defaultdict(float)
    for b in blocks:
        count[b.owner] += 1
        reserved[b.owner] += b.reserved_bytes
        oldest[b.owner] = max(oldest[b.owner], b.age_s)
    ranked = sorted(reserved, key=lambda o: (-reserved[o], o))[:NUM_OWNERS]
    return [Owner(o, count[o], reserved[o], round(oldest[o], 3)) for o in ranked]


def device_memory(state: ServerState, *, is_admin: bool) -> list[DeviceMemory]:
    seen: set[str] = set()
    out = []
    for _, _, engine in state.router.engines():
        if not engine.is_loaded:
            continue
        stats = engine.allocator_stats()
        if stats.device in seen:  # engines on one device share its allocator
            continue
        seen.add(stats.device)
        owners = _owners(engine.leak_report()) if is_admin else None
        out.append(
            DeviceMemory(
                stats.device, stats.bytes_in_use, stats.bytes_cached, stats.live_blocks, owners
            )
        )
    return out


def server_info(state: ServerState, *, is_admin: bool) -> ServerInfo:
    now = time.time()
    return ServerInfo(
        package_version=_package_version(),
        device=str(resolve_device(state.settings.device)),
        started_at=float(state.created),
        uptime_s=round(now - state.created, 3),
        now=now,
        is_ready=state.is_ready,
        load_error=state.load_error,
        versions=served_versions(state),
        memory=device_memory(state, is_admin=is_admin),
    )
