"""`TPModelRunner`: rank 0's step under tensor parallelism. The same pack / forward / logits /
sample as `ModelRunner`; before the forward, the step's inputs (token ids, slices, page tables,
pending page copies) go to every worker in one broadcast, then all ranks run the forward on
their shards together (two all_reduces per layer). Rank 0 alone computes logits and samples:
the LM head is replicated (runtime.models.parallel.shard says why).

A worker's death (seen before the step, or as a failed collective) restarts the workers and
raises `WorkersLost` (503): the core fails every live request, whose KV the workers no longer
hold, and drops the prefix cache for the same reason (runtime.engine.failures.fail_lost).

No fast path (compiled / captured step) under TP yet: the forward runs eagerly.
"""

from __future__ import annotations

from typing import Any

import torch

from runtime.engine.failures import WorkersLost
from runtime.engine.model_runner import ModelRunner, StepOutput
from runtime.engine.scheduled import SchedulerOutput
from runtime.engine.tp.messages import PoolSpec, StepMessage
from runtime.engine.tp.world import TPWorld
from runtime.memory.kv_cache import KVCache
from runtime.memory.kv_pool import SequenceKV
from runtime.models.batch_plan import SeqSlice
from runtime.models.loader import LoadedModel
from runtime.models.parallel.comm import CollectiveError


class TPModelRunner(ModelRunner):
    def __init__(self, loaded: LoadedModel, world: TPWorld, kv_cache: KVCache) -> None:
        super().__init__(loaded, None)
        self.world = world
        self.kv_cache = kv_cache
        self._copies: list[tuple[int, int]] = []  # page copies the workers have not made yet
        self._record_forks(kv_cache)
        data = kv_cache.pool.data
        world.send_pool(
            PoolSpec(
                num_layers=int(data.shape[0]),
                num_kv_heads=int(data.shape[2]),
                num_pages=int(data.shape[3]),
                page_size=int(data.shape[4]),
                head_dim=int(data.shape[5]),
            )
        )

    def _record_forks(self, kv_cache: KVCache) -> None:
        """`KVCache.fork` copies the parent's partial last page on rank 0; the workers must make
        the same copy in their pools before the next forward reads it."""
        fork = kv_cache.fork

        def recording_fork(parent: SequenceKV, seq_id: str) -> SequenceKV | None:
            kv = fork(parent, seq_id)
            if kv is not None and parent.num_tokens % parent.page_size:
                source = parent.page_ids[parent.num_tokens // parent.page_size]
                self._copies.append((source, kv.page_ids[-1]))
            return kv

        kv_cache.fork = recording_fork  # type: ignore[method-assign]

    def execute(self, batch: SchedulerOutput) -> StepOutput:
        world = self.world
        if world.broken is not None:
            raise WorkersLost(f"tensor-parallel workers unavailable: {world.broken}", self._reset)
        dead = world.dead_ranks()
        if dead:
            self._lose(f"worker rank(s) {dead} died", None)
        try:
            return super().execute(batch)
        except CollectiveError as exc:
            dead = world.dead_ranks()
            self._lose(f"worker rank(s) {dead} died" if dead else str(exc), exc)
        raise AssertionError("unreachable")

    def _lose(self, reason: str, cause: Exception | None) -> None:
        self.world.restart(reason)
        self._copies = []
        error = WorkersLost(f"tensor-parallel worker lost: {reason}", self._reset)
        raise error from cause

    def _reset(self) -> Any:
        return self.kv_cache.drop_cached()

    def _forward(
        self, input_ids: torch.Tensor, slices: list[SeqSlice], *, decode_only: bool
    ) -> torch.Tensor:
        copies, self._copies = self._copies, []
        self.world.send_step(StepMessage.of(input_ids, slices, copies))
        return self.model(input_ids, slices)

    def close(self) -> None:
        self.world.shutdown()
