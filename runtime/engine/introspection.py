"""The engine's control and introspection side: the batch policy at run time, the allocator's
and the KV cache's figures, LoRA adapters, tensor-parallel workers. Read by the admin API, the
status page and the samplers, never on a request's path: `Engine` (engine.py) inherits it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.engine.batching.controller import BatchPolicyConfig, BusyTracker
    from runtime.engine.build import EngineParts
    from runtime.engine.config import EngineConfig
    from runtime.engine.lora.registry import LoraStats
    from runtime.engine.self_check import IdleSelfCheck, SelfCheckResult
    from runtime.engine.stats import AllocatorStats, KVCacheStats
    from runtime.memory import LiveBlock


class EngineIntrospection:
    """What an `Engine` answers about itself; every method reads the built parts (loading the
    model first where the engine's own accessors would)."""

    config: EngineConfig
    self_check: IdleSelfCheck | None
    _tracker: BusyTracker

    if TYPE_CHECKING:  # defined by Engine

        @property
        def is_loaded(self) -> bool: ...

        @property
        def _parts(self) -> EngineParts: ...

    # --- control and introspection ---------------------------------------------------------------
    def set_batch_policy(self, min_util: float, max_util: float, step_size: float) -> None:
        self._parts.controller.set_batch_policy(min_util, max_util, step_size)

    @property
    def batch_size_limit(self) -> int:
        return self._parts.controller.limit

    @property
    def batch_policy(self) -> BatchPolicyConfig:
        """The controller's band and steps now (set_batch_policy changes them at run time)."""
        return self._parts.controller.config

    def self_check_result(self) -> SelfCheckResult | None:
        """The last idle self-check (None before the first, or before the model loaded)."""
        return self.self_check.last if self.self_check is not None else None

    def allocator_stats(self) -> AllocatorStats:
        return self._parts.allocator.stats()

    def leak_report(self) -> list[LiveBlock]:
        """The allocator's live blocks; the KV pool appears as its pages by holder."""
        return self._parts.allocator.leak_report()

    def weight_bytes(self) -> dict[str, int]:
        """Resident weight bytes by storage format (int8, int4, fp8, or the float dtype)."""
        from runtime.models.quantize import weight_bytes_by_format

        return weight_bytes_by_format(self._parts.loaded.model)

    # --- LoRA adapters (runtime.engine.lora) -------------------------------------------------
    def load_lora(self, name: str, path: str) -> int:
        """Register and make resident a PEFT adapter; its resident bytes (LoraAdapterError,
        ConflictError for a name in use, Overloaded when every resident adapter is busy)."""
        from runtime.engine.lora.wiring import lora_registry

        return lora_registry(self._parts, self.config).register(name, path).nbytes

    def unload_lora(self, name: str) -> None:
        """Forget an adapter and release its block (running requests finish with it)."""
        from runtime.engine.lora.wiring import lora_registry

        lora_registry(self._parts, self.config).unregister(name)

    def lora_stats(self) -> LoraStats | None:
        """Registered / resident adapters, loads, evictions; None for a model without them."""
        registry = self._parts.loras
        return None if registry is None else registry.stats()

    def kv_cache_stats(self) -> KVCacheStats:
        core = self._parts.core
        with core.lock:
            return core.scheduler.kv_stats()

    @property
    def num_running(self) -> int:
        return self._parts.core.scheduler.num_running if self.is_loaded else 0

    @property
    def num_waiting(self) -> int:
        return self._parts.core.scheduler.num_waiting if self.is_loaded else 0

    def busy_fraction(self) -> float | None:
        """Share of the last control interval the engine spent in the model forward."""
        return self._tracker.fraction()

    def utilization(self) -> float | None:
        """u, the batch controller's input: busy fraction x share of saturation throughput."""
        return self._parts.controller.source.read() if self.is_loaded else None

    def tp_worker_restarts(self) -> int | None:
        """Tensor-parallel worker restarts so far; None: no workers (or not loaded yet)."""
        if not self.is_loaded or self._parts.loaded.parallel is None:
            return None
        return int(self._parts.loaded.parallel.num_restarts)

    def tp_memory(self) -> list[dict[str, Any]] | None:
        """Tensor parallelism: each rank's memory (runtime.engine.tp.build.memory_rows); None
        without workers."""
        if not self.is_loaded or self._parts.loaded.parallel is None:
            return None
        from runtime.engine.tp.build import memory_rows

        return memory_rows(self._parts.loaded, self._parts.kv_cache)
