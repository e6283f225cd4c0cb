"""`TPWorld`: rank 0's view of its tensor-parallel workers: starts them (torch.multiprocessing,
spawn), joins the group with them, sends each step, notices a death and restarts them once.

A death is noticed before each step (`Process.is_alive`: a waitpid, microseconds) or by a
collective that fails or times out (runtime.models.parallel.comm); never by a hang. After a
death the workers are killed (those still alive), the group is torn down and made again on a
new port, the workers reload their shards and get the pool's geometry: their KV is empty, which
is why the caller fails every live request (runtime.engine.failures.fail_lost). One restart per
death; if the restart itself fails the world is broken and every later step is a 503.

Workers started by someone else (`spawn=False`: a LeaderWorkerSet's worker pods, each running
`python -m runtime.engine.tp.worker`) cannot be restarted from here; a death breaks the world
and the pod's restart policy takes over.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import socket
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import psutil

from runtime.engine.tp import group
from runtime.engine.tp.messages import SHUTDOWN, PoolSpec, StepMessage, WorkerSpec
from runtime.engine.tp.worker import worker_main

log = logging.getLogger("fastllm.tp")


@dataclass(frozen=True)
class RankMemory:
    rank: int
    pid: int | None
    rss_bytes: int | None
    kv_pool_bytes: int
    weight_bytes: int
    alive: bool


def _rss(pid: int) -> int | None:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.Error, OSError):  # gone between the check and the read
        return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TPWorld:
    def __init__(self, spec: WorkerSpec, *, spawn: bool = True) -> None:
        self.spec = spec
        self.spawn = spawn
        self.procs: list[Any] = []  # multiprocessing Process of ranks 1..N-1 (spawn mode)
        self.control: Any = None
        self.pool: PoolSpec | None = None
        self.num_restarts = 0
        self.broken: str | None = None  # why no step can run any more
        self.lock = threading.Lock()

    @property
    def world(self) -> int:
        return self.spec.world

    def start(self) -> None:
        """Start the workers and join the group with them (they load their shards meanwhile)."""
        if self.spawn:
            self.spec = replace(self.spec, master_port=free_port())
            ctx = mp.get_context("spawn")
            self.procs = []
            for rank in range(1, self.spec.world):
                proc = ctx.Process(
                    target=worker_main,
                    args=(self.spec, rank),
                    name=f"fastllm-tp-rank{rank}",
                    daemon=True,  # never outlives the server
                )
                proc.start()
                self.procs.append(proc)
        started = time.perf_counter()
        self.control = group.join(self.spec, 0)
        log.info(
            "tensor parallel: %d ranks joined on %s:%d (%s) in %.1f s",
            self.spec.world,
            self.spec.master_addr,
            self.spec.master_port,
            self.spec.backend,
            time.perf_counter() - started,
        )

    def send_pool(self, pool: PoolSpec) -> None:
        self.pool = pool
        # on the default group (the joining wait): a worker may still be loading its shard
        group.broadcast(pool, None)

    def dead_ranks(self) -> list[int]:
        return [rank for rank, proc in enumerate(self.procs, start=1) if not proc.is_alive()]

    def send_step(self, message: StepMessage) -> None:
        group.broadcast(message, self.control)

    def restart(self, reason: str) -> None:
        """Kill what is left of the workers, start them again, rejoin. Raises nothing: a failed
        restart marks the world broken (every later step fails with 503)."""
        log.error("tensor parallel: %s; restarting the workers", reason)
        self._stop_workers(graceful=False)
        if not self.spawn:
            self.broken = f"{reason} (external workers: restarted by their pods, not here)"
            return
        try:
            self.start()
            if self.pool is not None:
                self.send_pool(self.pool)
        except Exception as exc:
            self.broken = f"{reason}; the restart failed: {exc}"
            log.exception("tensor parallel: the restart failed")
            self._stop_workers(graceful=False)
            return
        self.num_restarts += 1
        log.warning("tensor parallel: workers restarted (%d so far)", self.num_restarts)

    def memory(self, kv_pool_bytes: int, weight_bytes: int) -> list[RankMemory]:
        """Per rank: resident memory (the OS's RSS of its process: None for a worker this
        process did not start), its KV pool and its weights. Ranks hold equal shards and pools
        of the same geometry, so the pool and weight bytes are rank 0's; RSS is read from each
        process (psutil), never by a collective, so it is safe from any thread."""
        rows = [RankMemory(0, os.getpid(), _rss(os.getpid()), kv_pool_bytes, weight_bytes, True)]
        for rank, proc in enumerate(list(self.procs), start=1):
            alive = proc.is_alive()
            rss = _rss(proc.pid) if alive and proc.pid is not None else None
            rows.append(RankMemory(rank, proc.pid, rss, kv_pool_bytes, weight_bytes, alive))
        return rows

    def shutdown(self) -> None:
        self._stop_workers(graceful=True)

    def _stop_workers(self, *, graceful: bool) -> None:
        if graceful and self.control is not None and not self.dead_ranks():
            with contextlib.suppress(Exception):  # the workers are killed below anyway
                group.broadcast(SHUTDOWN, self.control)
        for proc in self.procs:
            proc.join(timeout=5.0 if graceful else 0.0)
            if proc.is_alive():
                proc.kill()  # our own child, by its handle
                proc.join(timeout=5.0)
        self.procs = []
        self.control = None
        group.leave()
