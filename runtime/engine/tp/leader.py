"""`TPLeader`: rank 0's side of a tensor-parallel step. Before each forward, the step's inputs
(token ids, slices, page tables, pending page copies) go to every worker in one broadcast; then
all ranks run the forward on their shards together (two all_reduces per layer). Rank 0 alone
computes logits and samples: the LM head is replicated (runtime.models.parallel.shard says why).

The runner that drives it (runtime.engine.tp_runner.TPModelRunner, a `ModelRunner`) lives one
level up, so this package never imports the runner or the scheduler's batch: the runner calls
`send_step` from its forward, `restart` when a worker died, and hands `reset` to the error that
fails the live requests.
"""

from __future__ import annotations

import torch

from runtime.engine.tp.messages import PoolSpec, StepMessage
from runtime.engine.tp.world import TPWorld
from runtime.memory.kv_cache import KVCache
from runtime.models.batch_plan import SeqSlice

__all__ = ["TPLeader"]


class TPLeader:
    def __init__(self, world: TPWorld, kv_cache: KVCache) -> None:
        self.world = world
        self.kv_cache = kv_cache
        self._copies: list[tuple[int, int]] = []  # page copies the workers have not made yet
        kv_cache.on_page_copy = self._record_copy
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

    def _record_copy(self, source: int, dest: int) -> None:
        """`KVCache` copied a page on rank 0 (a fork's partial last page, a partial prefix
        hit); the workers must make the same copy in their pools before the next forward."""
        self._copies.append((source, dest))

    def send_step(self, input_ids: torch.Tensor, slices: list[SeqSlice]) -> None:
        """The step's inputs, and the page copies made since the last one, to every worker."""
        copies, self._copies = self._copies, []
        self.world.send_step(StepMessage.of(input_ids, slices, copies))

    def restart(self, reason: str) -> None:
        """A worker died: new workers (the copies were for the old ones' pools)."""
        self.world.restart(reason)
        self._copies = []

    def reset(self) -> object:
        """Rank 0's prefix cache, whose K/V the restarted workers do not hold."""
        return self.kv_cache.drop_cached()

    def close(self) -> None:
        self.world.shutdown()
