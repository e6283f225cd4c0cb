"""The one collective inside a tensor-parallel forward: the all_reduce that ends each
row-parallel projection (o_proj, down_proj), twice per layer.

`make_row_parallel` replaces the projection's `add_to_` (the residual add the layer calls) on
that module only, once at load: the layer code and the TP=1 path are untouched, and a quantized
projection (runtime.models.quant) is wrapped the same way. The all_reduce runs on the data group
(NCCL on CUDA, gloo on CPU; `set_data_group`), created with the engine's collective timeout, so
a dead or hung peer raises `CollectiveError` instead of hanging the step.
"""

from __future__ import annotations

import time
from typing import Any

import torch.distributed as dist
from torch import Tensor, nn


class CollectiveError(RuntimeError):
    """A collective failed: a peer died, or did not answer within the group's timeout."""


class CommStats:
    """Time spent in the forward's all_reduces (bench.tp reports it per step)."""

    def __init__(self) -> None:
        self.timed = False  # off unless asked: a clock read per call is not free at batch 1
        self.num_calls = 0
        self.seconds = 0.0


STATS = CommStats()


class _Groups:
    data: Any = None  # the all_reduce group (set by the engine when a rank joins); None: default


GROUPS = _Groups()


def set_data_group(group: Any) -> None:
    """The group the all_reduces run on: its timeout is the engine's collective timeout, apart
    from the (longer) one the ranks had to join in."""
    GROUPS.data = group


def all_reduce_(tensor: Tensor) -> Tensor:
    """Sum `tensor` over the ranks, in place."""
    started = time.perf_counter() if STATS.timed else 0.0
    try:
        dist.all_reduce(tensor, group=GROUPS.data)
    except Exception as exc:  # gloo / NCCL raise their own types (DistBackendError, RuntimeError)
        raise CollectiveError(f"all_reduce failed: {exc}") from exc
    if STATS.timed:
        STATS.num_calls += 1
        STATS.seconds += time.perf_counter() - started
    return tensor


def make_row_parallel(module: nn.Module) -> None:
    """out += all_reduce(module(x)) for `module.add_to_(out, x)`: each rank's partial product
    over its slice of the input features, summed. (A bias lives on rank 0 only: see shard.)"""

    def add_to_(out: Tensor, x: Tensor) -> Tensor:
        return out.add_(all_reduce_(module(x)))

    module.add_to_ = add_to_  # type: ignore[assignment]
