"""Work-stealing pool for several engine replicas: one thread per worker (GPU or CPU replica).

Each thread loops `take` → `handler(worker_index, task)` → `done` on a `StealingQueues`
(`work_queues.py`: own FIFO deque first, steal from the longest when idle, aged tasks first so
no task is overtaken by more than `PoolConfig.max_overtakes` later ones). Generic over the task
type and independent of torch.

    pool = WorkStealingPool(handle, PoolConfig(num_workers=4))
    pool.start(); pool.submit(request); ...; pool.shutdown(drain=True)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from runtime.serving.work_queues import PoolConfig, PoolStats, StealingQueues, Taken, TaskRecord

T = TypeVar("T")

__all__ = ["PoolConfig", "PoolStats", "StealingQueues", "Taken", "TaskRecord", "WorkStealingPool"]

log = logging.getLogger(__name__)


class WorkStealingPool(Generic[T]):
    """Threads that run `handler(worker_index, task)`. A handler exception is counted as a failed
    task and passed to `on_error` (default: logged); the worker carries on."""

    def __init__(
        self,
        handler: Callable[[int, T], object],
        config: PoolConfig | None = None,
        *,
        on_error: Callable[[int, T, Exception], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
        name: str = "fastllm-worker",
    ) -> None:
        self.config = config or PoolConfig()
        self.queues: StealingQueues[T] = StealingQueues(self.config, clock=clock)
        self._handler = handler
        self._on_error = on_error
        self._name = name
        self._threads: list[threading.Thread] = []
        self._started = False
        self._start_lock = threading.Lock()

    @property
    def num_workers(self) -> int:
        return self.config.num_workers

    @property
    def num_alive(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def start(self) -> None:
        """Start the threads (idempotent). Tasks submitted before start wait in the deques."""
        with self._start_lock:
            if self._started:
                return
            self._started = True
            for i in range(self.num_workers):
                # daemon: a handler stuck forever must not keep the interpreter alive at exit
                t = threading.Thread(
                    target=self._run, args=(i,), name=f"{self._name}-{i}", daemon=True
                )
                self._threads.append(t)
                t.start()

    def submit(self, task: T, worker: int | None = None) -> int:
        """Queue a task (on `worker`'s deque, default least loaded); returns its sequence number.
        Raises ServiceUnavailable after shutdown, Overloaded beyond `max_queued`."""
        return self.queues.put(task, worker)

    def _run(self, worker: int) -> None:
        while True:
            taken = self.queues.take(worker, block=True)
            if taken is None:  # closed and drained
                return
            failed = False
            try:
                self._handler(worker, taken.task)
            except Exception as exc:  # one bad task must not kill the worker
                failed = True
                self._report(worker, taken.task, exc)
            finally:
                self.queues.done(worker, failed=failed)

    def _report(self, worker: int, task: T, exc: Exception) -> None:
        if self._on_error is None:
            log.exception("worker %d: task failed", worker, exc_info=exc)
            return
        try:
            self._on_error(worker, task, exc)
        except Exception:
            log.exception("worker %d: on_error failed", worker)

    def wait_idle(self, timeout: float | None = None) -> bool:
        return self.queues.wait_idle(timeout)

    def shutdown(self, *, drain: bool = True, timeout: float | None = None) -> list[T]:
        """Stop accepting tasks and stop the workers. drain=True runs every queued task first;
        drain=False (or a pool never started) returns the queued tasks instead. Waits up to
        `timeout` for the threads; `num_alive` tells whether one is still stuck in a handler."""
        dropped = self.queues.close(drain=drain and self._started)
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            t.join(remaining)
        return dropped

    def stats(self) -> PoolStats:
        return self.queues.stats()

    def __enter__(self) -> WorkStealingPool[T]:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown(drain=exc_info[0] is None)
