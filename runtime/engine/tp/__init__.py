"""Tensor parallelism across processes: rank 0 (this process: server, scheduler, KV
bookkeeping, sampling) and ranks 1..N-1 (worker processes that run the same step on their
shard of the model). `TPWorld` starts, watches and restarts the workers; `TPLeader` sends
each step's inputs to them once per step (for runtime.engine.tp_runner.TPModelRunner, one level
up); `worker` is their loop. The sharded model itself is runtime.models.parallel."""

from runtime.engine.tp.leader import TPLeader
from runtime.engine.tp.messages import PoolSpec, StepMessage, WorkerSpec
from runtime.engine.tp.world import TPWorld

__all__ = ["PoolSpec", "StepMessage", "TPLeader", "TPWorld", "WorkerSpec"]
