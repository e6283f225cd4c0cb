"""Joining and leaving the tensor-parallel process group, the same on every rank.

Two groups: the default one (NCCL on CUDA, gloo on CPU) carries the forward's all_reduces with
the engine's collective timeout; the control group (always gloo) carries the per-step broadcast.
A gloo timeout is each process's own setting: rank 0 waits `timeout_s` for its workers, a worker
waits as long as the server idles (days) for rank 0's next step, and learns of rank 0's death
from the closed connection, not a timer.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from runtime.engine.tp.messages import WorkerSpec
from runtime.models.parallel.comm import CollectiveError

IDLE_WAIT = timedelta(days=7)  # a worker's wait for the next step


def join(spec: WorkerSpec, rank: int) -> Any:
    """init_process_group + the control group; returns the control group."""
    dist.init_process_group(
        spec.backend,
        init_method=f"tcp://{spec.master_addr}:{spec.master_port}",
        rank=rank,
        world_size=spec.world,
        timeout=timedelta(seconds=spec.timeout_s),
    )
    control_timeout = timedelta(seconds=spec.timeout_s) if rank == 0 else IDLE_WAIT
    return dist.new_group(backend="gloo", timeout=control_timeout)


def leave() -> None:
    if dist.is_initialized():
        # a group whose peers are gone may fail to tear down: it is dropped all the same
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def broadcast(obj: object, control: Any) -> object:
    """Rank 0 sends `obj`, every other rank receives and returns it."""
    box = [obj]
    try:
        dist.broadcast_object_list(box, src=0, group=control)
    except Exception as exc:
        raise CollectiveError(f"step broadcast failed: {exc}") from exc
    return box[0]
