"""The engine's adapters: which names are registered (name -> PEFT directory), which of them are
resident (weights in an allocator block), and the LRU that keeps at most `max_loras` resident.

    registry.register("sql", "/adapters/sql")     # read, validated, made resident (or an error)
    adapter = registry.acquire("sql")              # per request: resident again if evicted; LRU
    registry.unregister("sql")                     # its block released: bytes back
    registry.stats()                               # resident, loading, loads, evictions, bytes

Residency: each resident adapter owns one allocator block (owner `lora:<name>`) holding its
fused weights (runtime.models.lora.weights). Making one more resident beyond `max_loras` evicts
the least recently used adapter that no live sequence uses (the engine's `in_use`); an evicted
adapter stays registered and is read again from its directory on its next request. With every
resident adapter busy, the request is refused with 429 (Overloaded), never queued behind a load.

Memory stays safe if an adapter goes while a sequence still holds its weights (an unregister
under load): the allocator reclaims a block only once no alias of its memory is alive.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from runtime.errors import ConflictError, ModelNotFoundError, Overloaded
from runtime.memory import Allocator
from runtime.memory.block import Block
from runtime.models.config import ModelArgs
from runtime.models.lora import LoraWeights, pack_adapter, packed_numel, read_adapter
from runtime.models.lora.peft import AdapterTensors, resolve_adapter_path

__all__ = ["LoraLimits", "LoraRegistry", "LoraStats", "ResidentAdapter"]


@dataclass(frozen=True)
class LoraLimits:
    max_loras: int = 4  # adapters resident at once (LRU beyond)
    max_lora_rank: int = 16  # the largest `r` an adapter may have
    lora_dir: Path | None = None  # adapters only from under this directory (None: anywhere)


@dataclass(eq=False)
class ResidentAdapter:
    name: str
    key: str  # name#serial: what the prefix cache's salt carries (a reload gets a new serial)
    weights: LoraWeights
    block: Block
    nbytes: int
    rank: int


@dataclass
class _Registered:
    name: str
    path: Path
    serial: int
    resident: ResidentAdapter | None = None


@dataclass
class LoraStats:
    registered: list[str] = field(default_factory=list)
    resident_bytes: dict[str, int] = field(default_factory=dict)  # name -> block bytes
    loads_total: int = 0  # adapters made resident (first load and reloads after eviction)
    evictions_total: int = 0
    load_seconds_total: float = 0.0
    num_loading: int = 0  # adapters being read from their directory right now (load or reload)

    @property
    def num_resident(self) -> int:
        return len(self.resident_bytes)


class LoraRegistry:
    def __init__(
        self,
        args: ModelArgs,
        dtype: torch.dtype,
        device: torch.device,
        allocator: Allocator,
        limits: LoraLimits,
        *,
        in_use: Callable[[], Iterable[str]] = lambda: (),
        owner_prefix: str = "lora",
    ) -> None:
        self.args, self.dtype, self.device = args, dtype, device
        self.allocator, self.limits = allocator, limits
        self.in_use = in_use  # names of the adapters live sequences hold
        self.owner_prefix = owner_prefix
        self._lock = threading.Lock()
        self._registered: dict[str, _Registered] = {}
        self._lru: OrderedDict[str, ResidentAdapter] = OrderedDict()  # oldest first
        self._serial = 0
        self._loads = self._evictions = 0
        self._loading = 0  # reads in progress (outside the lock: counted for the metrics)
        self._load_seconds = 0.0
        # the resident names, replaced whole under the lock and read without it (the engine's
        # idle self-check reads it under the core lock: taking ours there could deadlock)
        self.resident_names: frozenset[str] = frozenset()

    def register(self, name: str, path: str | Path) -> ResidentAdapter:
        """Validate and make resident (LoraAdapterError / ConflictError / Overloaded)."""
        resolved = resolve_adapter_path(path, self.limits.lora_dir)
        self._check_free(name)  # before reading: a taken name fails fast
        start = time.perf_counter()
        tensors = self._read(resolved)  # outside the lock: a slow read blocks no admission
        with self._lock:
            self._check_free(name)
            self._serial += 1
            entry = _Registered(name, resolved, self._serial)
            adapter = self._install(entry, tensors, start)  # raises before registering
            self._registered[name] = entry
            return adapter

    def _check_free(self, name: str) -> None:
        if name in self._registered:
            raise ConflictError(
                f"adapter {name!r} is already loaded", param="lora_name", code="lora_exists"
            )

    def _read(self, path: Path) -> AdapterTensors:
        """Called without the lock held (a slow read blocks no admission)."""
        with self._lock:
            self._loading += 1
        try:
            return read_adapter(path, self.args, max_rank=self.limits.max_lora_rank)
        finally:
            with self._lock:
                self._loading -= 1

    def unregister(self, name: str) -> None:
        with self._lock:
            entry = self._registered.pop(name, None)
            if entry is None:
                raise ModelNotFoundError(
                    f"adapter {name!r} is not loaded", param="lora_name", code="lora_not_found"
                )
            if entry.resident is not None:
                self._drop(entry)

    def __contains__(self, name: object) -> bool:
        return name in self._registered

    @property
    def names(self) -> list[str]:
        return sorted(self._registered)

    def acquire(self, name: str) -> ResidentAdapter:
        """The adapter's resident weights for a request (read again if it was evicted)."""
        with self._lock:
            entry = self._lookup(name)
            if entry.resident is not None:
                self._lru.move_to_end(name)
                return entry.resident
            path, serial = entry.path, entry.serial
        start = time.perf_counter()
        tensors = self._read(path)  # outside the lock, as in register
        with self._lock:
            entry = self._lookup(name)
            if entry.serial != serial:  # unloaded and loaded again meanwhile: not this one
                raise ModelNotFoundError(
                    f"adapter {name!r} was reloaded; retry", param="model", code="model_not_found"
                )
            if entry.resident is not None:  # another request made it resident meanwhile
                self._lru.move_to_end(name)
                return entry.resident
            return self._install(entry, tensors, start)

    def _lookup(self, name: str) -> _Registered:
        entry = self._registered.get(name)
        if entry is None:
            raise ModelNotFoundError(
                f"adapter {name!r} does not exist", param="model", code="model_not_found"
            )
        return entry

    def _install(
        self, entry: _Registered, tensors: AdapterTensors, start: float
    ) -> ResidentAdapter:
        """Under the lock: evict if full, take the block, pack the weights into it."""
        if len(self._lru) >= self.limits.max_loras:
            self._evict_one()
        numel = packed_numel(tensors, self.args)
        block = self.allocator.alloc(
            (numel,), self.dtype, owner=f"{self.owner_prefix}:{entry.name}"
        )
        try:
            weights = pack_adapter(tensors, self.args, block.tensor)
        except BaseException:
            block.release()
            raise
        adapter = ResidentAdapter(
            name=entry.name,
            key=f"{entry.name}#{entry.serial}",
            weights=weights,
            block=block,
            nbytes=block.reserved_bytes,  # what the allocator counts (a size class may round up)
            rank=tensors.config.rank,
        )
        entry.resident = adapter
        self._lru[entry.name] = adapter
        self.resident_names = frozenset(self._lru)
        self._loads += 1
        self._load_seconds += time.perf_counter() - start
        return adapter

    def _evict_one(self) -> None:
        busy = set(self.in_use())
        victim = next((name for name in self._lru if name not in busy), None)
        if victim is None:
            raise Overloaded(
                f"all {self.limits.max_loras} resident adapters are in use (max_loras)",
                retry_after_s=1.0,
                code="lora_slots_busy",
            )
        self._drop(self._registered[victim])
        self._evictions += 1

    def _drop(self, entry: _Registered) -> None:
        adapter = entry.resident
        assert adapter is not None
        entry.resident = None
        self._lru.pop(entry.name, None)
        self.resident_names = frozenset(self._lru)
        adapter.block.release()

    def stats(self) -> LoraStats:
        with self._lock:
            return LoraStats(
                registered=sorted(self._registered),
                resident_bytes={name: a.nbytes for name, a in self._lru.items()},
                loads_total=self._loads,
                evictions_total=self._evictions,
                load_seconds_total=self._load_seconds,
                num_loading=self._loading,
            )

    def close(self) -> None:
        with self._lock:
            for entry in list(self._registered.values()):
                if entry.resident is not None:
                    self._drop(entry)
            self._registered.clear()
