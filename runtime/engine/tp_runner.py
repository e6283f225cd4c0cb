"""`TPModelRunner`: rank 0's step under tensor parallelism. The same pack / forward / logits /
sample as `ModelRunner`; its forward first sends the step's inputs to every worker
(runtime.engine.tp.leader.TPLeader), then all ranks run the forward on their shards together.
Kept here, next to the runner it extends, so runtime.engine.tp never imports the runner.

A worker's death (seen before the step, or as a failed collective) restarts the workers and
raises `WorkersLost` (503): the core fails every live request, whose KV the workers no longer
hold, and drops the prefix cache for the same reason (runtime.engine.failures.fail_lost).

No fast path (compiled / captured step) under TP yet: the forward runs eagerly.
"""

from __future__ import annotations

import torch

from runtime.engine.failures import WorkersLost
from runtime.engine.model_runner import ModelRunner, StepOutput
from runtime.engine.scheduled import SchedulerOutput
from runtime.engine.tp.leader import TPLeader
from runtime.engine.tp.world import TPWorld
from runtime.memory.kv_cache import KVCache
from runtime.models.batch_plan import SeqSlice
from runtime.models.loader import LoadedModel
from runtime.models.parallel.comm import CollectiveError

__all__ = ["TPModelRunner", "make_runner"]


class TPModelRunner(ModelRunner):
    def __init__(self, loaded: LoadedModel, leader: TPLeader) -> None:
        super().__init__(loaded, None)
        self.leader = leader

    def execute(self, batch: SchedulerOutput) -> StepOutput:
        world = self.leader.world
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
        self.leader.restart(reason)
        error = WorkersLost(f"tensor-parallel worker lost: {reason}", self._reset)
        raise error from cause

    def _reset(self) -> object:
        return self.leader.reset()

    def _forward(
        self, input_ids: torch.Tensor, slices: list[SeqSlice], *, decode_only: bool
    ) -> torch.Tensor:
        self.leader.send_step(input_ids, slices)
        return self.model(input_ids, slices)

    def close(self) -> None:
        self.leader.close()


def make_runner(loaded: LoadedModel, kv_cache: KVCache) -> TPModelRunner:
    """Rank 0's runner, once the KV pool exists (the workers get its shape)."""
    assert isinstance(loaded.parallel, TPWorld)
    return TPModelRunner(loaded, TPLeader(loaded.parallel, kv_cache))
