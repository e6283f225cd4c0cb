"""A replica set's control and figures: the batch policy on every replica, the pool's steals,
allocator, KV and weight figures summed or taken once per device. Read by the admin API, the
status page and the samplers, never on a request's path: `ReplicaSet` (replicas.py) inherits it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.engine.stats import KVCacheStats

if TYPE_CHECKING:
    from runtime.engine.batching.controller import BatchPolicyConfig
    from runtime.engine.client import SequenceVerifier
    from runtime.engine.engine import Engine
    from runtime.engine.stats import AllocatorStats
    from runtime.memory import LiveBlock
    from runtime.serving.replica_handle import QueuedRequest
    from runtime.serving.work_queues import PoolStats, StealingQueues


class ReplicaIntrospection:
    """What a `ReplicaSet` answers about its replicas and its pool."""

    replicas: list[Engine]
    queues: StealingQueues[QueuedRequest]

    @property
    def num_steals(self) -> int:
        """Requests a replica took from another replica's deque (fastllm_scheduler_steals_total).
        Read from the pool's own counter, under its lock."""
        return self.queues.stats().num_steals

    def pool_stats(self) -> PoolStats:
        return self.queues.stats()

    @property
    def verifier(self) -> SequenceVerifier | None:
        return self.replicas[0].verifier

    @verifier.setter
    def verifier(self, verifier: SequenceVerifier | None) -> None:
        for engine in self.replicas:
            engine.verifier = verifier

    def set_batch_policy(self, min_util: float, max_util: float, step_size: float) -> None:
        for engine in self.replicas:
            engine.set_batch_policy(min_util, max_util, step_size)

    @property
    def batch_size_limit(self) -> int:
        return sum(engine.batch_size_limit for engine in self.replicas)

    @property
    def batch_policy(self) -> BatchPolicyConfig:
        return self.replicas[0].batch_policy  # set_batch_policy sets every replica alike

    def _per_device(self) -> list[Engine]:
        """One replica per device: replicas on one device share its allocator."""
        seen: dict[str, Engine] = {}
        for engine in self.replicas:
            seen.setdefault(str(engine.loaded.device), engine)
        return list(seen.values())

    def allocator_stats(self) -> AllocatorStats:
        """The first device's allocator (all replicas share it on one device)."""
        return self.replicas[0].allocator_stats()

    def leak_report(self) -> list[LiveBlock]:
        return [block for engine in self._per_device() for block in engine.leak_report()]

    def weight_bytes(self) -> dict[str, int]:
        """Every replica's weights (each loads its own copy), by storage format."""
        total: dict[str, int] = {}
        for engine in self.replicas:
            for fmt, nbytes in engine.weight_bytes().items():
                total[fmt] = total.get(fmt, 0) + nbytes
        return total

    def kv_cache_stats(self) -> KVCacheStats:
        """Every replica's page pool (each has its own) as one."""
        return KVCacheStats.total([engine.kv_cache_stats() for engine in self.replicas])

    @property
    def num_running(self) -> int:
        return sum(engine.num_running for engine in self.replicas)

    @property
    def num_waiting(self) -> int:
        return len(self.queues) + sum(engine.num_waiting for engine in self.replicas)

    def busy_fraction(self) -> float | None:
        values = [v for v in (e.busy_fraction() for e in self.replicas) if v is not None]
        return sum(values) / len(values) if values else None

    def utilization(self) -> float | None:
        """Mean u of the replicas that have one (each replica's controller reads its own)."""
        values = [v for v in (e.utilization() for e in self.replicas) if v is not None]
        return sum(values) / len(values) if values else None
