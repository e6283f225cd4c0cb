"""Joining and leaving the tensor-parallel process group, the same on every rank.

Three groups: the default one (the rendezvous, a long wait); the data group (NCCL on CUDA, gloo
on CPU) carries the forward's all_reduces with the engine's collective timeout; the control
group (always gloo) carries the per-step broadcast.
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
from runtime.models.parallel.comm import CollectiveError, set_data_group

IDLE_WAIT = timedelta(days=7)  # a worker's wait for the next step
JOIN_WAIT = timedelta(minutes=10)  # every rank's wait for the others to join


def join(spec: WorkerSpec, rank: int) -> Any:
    """init_process_group, the data group (the all_reduces) and the control group; returns the
    control group. Joining may take minutes (workers start, import torch, on a busy host or a
    pod being scheduled): the default group waits JOIN_WAIT for its ranks, the data group's
    collectives `timeout_s`."""
    timeout = timedelta(seconds=spec.timeout_s)
    dist.init_process_group(
        spec.backend,
        init_method=f"tcp://{spec.master_addr}:{spec.master_port}",
        rank=rank,
        world_size=spec.world,
        timeout=max(timeout, JOIN_WAIT),
    )
    set_data_group(dist.new_group(backend=spec.backend, timeout=timeout))
    return dist.new_group(backend="gloo", timeout=timeout if rank == 0 else IDLE_WAIT)


def leave() -> None:
    set_data_group(None)
    if dist.is_initialized():
        # a group whose peers are gone may fail to tear down: it is dropped all the same
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def broadcast(obj: object, control: Any) -> object:
    """Rank 0 sends `obj`, every other rank receives and returns it (`control` None: on the
    default group)."""
    box = [obj]
    try:
        dist.broadcast_object_list(box, src=0, group=control)
    except Exception as exc:
        raise CollectiveError(f"step broadcast failed: {exc}") from exc
    return box[0]
