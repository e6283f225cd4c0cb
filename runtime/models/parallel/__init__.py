"""Tensor parallelism inside one model: which slice of each weight a rank holds (`shard`), the
collective a row-parallel projection ends with (`comm`), and loading a rank's shard (`load`).

The engine side (worker processes, the per-step broadcast, restarts) is runtime.engine.tp.
"""

from runtime.models.parallel.shard import ShardSpec, check_tp, shard_args

__all__ = ["ShardSpec", "check_tp", "shard_args"]
