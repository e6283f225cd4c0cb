"""Policy core of the work-stealing pool (serving/workers.py): per-worker deques, stealing, aging.

Each worker owns a FIFO deque. A worker takes, in this order:
  1. the globally oldest queued task if it is *aged* (see below), from whichever deque holds it;
  2. else the head (oldest) of its own deque;
  3. else it steals the head of the longest deque (ties: the one with the older head).
A task is aged once `max_overtakes` tasks have been taken since it was submitted, or it has waited
`max_wait_s`. Both ages grow with submission order, so "the oldest task is aged" is the same as
"some task is aged", and rule 1 gives the bound the old thread pool lacked: no task is overtaken
by more than `max_overtakes` later tasks (0 = strict global FIFO), whatever the interleaving.

`StealingQueues` is thread-safe and works in pull mode, for a replica loop that takes work when
it has room (`put`, `take`, `done`); `runtime.serving.workers.WorkStealingPool` adds one thread per
worker that calls `handler(worker_index, task)`. One lock guards all deques: tasks are requests,
not micro-tasks, and a single lock keeps aging, stealing and shutdown simple and deadlock-free.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from runtime.errors import ConfigError, Overloaded, ServiceUnavailable

T = TypeVar("T")

__all__ = ["PoolConfig", "PoolStats", "StealingQueues", "Taken", "TaskRecord"]


@dataclass(frozen=True)
class PoolConfig:
    num_workers: int = 1
    max_overtakes: int | None = 32  # aging by order; None disables it
    max_wait_s: float | None = None  # aging by time on the pool's clock; None disables it
    max_queued: int | None = None  # put() beyond this raises Overloaded; None = unbounded
    record_limit: int = 4096  # recent TaskRecords kept for stats

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ConfigError("num_workers must be >= 1", param="num_workers")
        if self.max_overtakes is not None and self.max_overtakes < 0:
            raise ConfigError("max_overtakes must be >= 0", param="max_overtakes")
        if self.max_wait_s is not None and self.max_wait_s < 0:
            raise ConfigError("max_wait_s must be >= 0", param="max_wait_s")
        if self.max_queued is not None and self.max_queued < 1:
            raise ConfigError("max_queued must be >= 1", param="max_queued")


@dataclass(frozen=True)
class TaskRecord:
    """How one task was taken."""

    seq: int  # submission order (0, 1, ...)
    placed_on: int  # the worker whose deque it was put on
    taken_by: int
    take_index: int  # global take order (0, 1, ...)
    picks_waited: int  # tasks taken between its submission and its own take
    queue_wait_s: float
    is_stolen: bool
    is_aged: bool  # taken by the aging rule


@dataclass(frozen=True)
class Taken(Generic[T]):
    task: T
    record: TaskRecord


@dataclass(frozen=True)
class PoolStats:
    num_workers: int
    num_submitted: int
    num_taken: int
    num_completed: int
    num_failed: int
    num_steals: int
    num_aged_takes: int
    queue_lengths: tuple[int, ...]
    processed_per_worker: tuple[int, ...]  # tasks taken by each worker
    max_queue_wait_s: float
    total_queue_wait_s: float
    max_picks_waited: int
    recent: tuple[TaskRecord, ...]  # newest last, at most PoolConfig.record_limit

    @property
    def mean_queue_wait_s(self) -> float:
        return self.total_queue_wait_s / self.num_taken if self.num_taken else 0.0


@dataclass
class _Entry(Generic[T]):
    task: T
    seq: int
    placed_on: int
    submitted_at: float
    takes_at_submit: int


class StealingQueues(Generic[T]):
    """Per-worker FIFO deques with stealing and aging; thread-safe, pull mode.

    A worker that takes a task must call `done(worker)` when it finishes (in-flight counts drive
    least-loaded placement and `wait_idle`)."""

    def __init__(self, config: PoolConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        n = config.num_workers
        self._deques: list[deque[_Entry[T]]] = [deque() for _ in range(n)]
        lock = threading.Lock()
        self._work = threading.Condition(lock)  # a task was put, or the queues closed
        self._idle = threading.Condition(lock)  # a task was taken or finished
        self._seq = itertools.count()
        self._rr = 0  # placement tie-break cursor
        self._closed = False
        self._inflight = [0] * n
        self._processed = [0] * n
        self._recent: deque[TaskRecord] = deque(maxlen=config.record_limit)
        self._num_submitted = self._num_taken = self._num_completed = self._num_failed = 0
        self._num_steals = self._num_aged = self._max_picks_waited = 0
        self._max_wait_s = self._total_wait_s = 0.0

    @property
    def num_workers(self) -> int:
        return len(self._deques)

    def __len__(self) -> int:
        with self._work:
            return sum(len(d) for d in self._deques)

    def put(self, task: T, worker: int | None = None) -> int:
        """Queue `task` on `worker`'s deque (default: least loaded). Returns its sequence number."""
        with self._work:
            if self._closed:
                raise ServiceUnavailable("the worker pool is shutting down")
            if worker is not None and not 0 <= worker < self.num_workers:
                raise ConfigError(f"no worker {worker} (have {self.num_workers})", param="worker")
            cap = self.config.max_queued
            if cap is not None and sum(len(d) for d in self._deques) >= cap:
                raise Overloaded(f"worker pool queue is full ({cap} tasks)")
            if worker is None:
                worker = self._least_loaded()
            seq = next(self._seq)
            entry = _Entry(task, seq, worker, self._clock(), self._num_taken)
            self._deques[worker].append(entry)
            self._num_submitted += 1
            self._work.notify()  # every waiter can take any task (stealing), so one suffices
            return seq

    def _least_loaded(self) -> int:
        n = self.num_workers
        order = [(self._rr + k) % n for k in range(n)]  # rotate so ties spread round robin
        worker = min(order, key=lambda w: len(self._deques[w]) + self._inflight[w])
        self._rr = (worker + 1) % n
        return worker

    def _is_aged(self, entry: _Entry[T], now: float) -> bool:
        c = self.config
        if (
            c.max_overtakes is not None
            and self._num_taken - entry.takes_at_submit >= c.max_overtakes
        ):
            return True
        return c.max_wait_s is not None and now - entry.submitted_at >= c.max_wait_s

    def _pick(self, worker: int) -> Taken[T] | None:
        heads = [(d[0].seq, i) for i, d in enumerate(self._deques) if d]
        if not heads:
            return None
        now = self._clock()
        oldest = min(heads)[1]
        is_aged = self._is_aged(self._deques[oldest][0], now)
        if is_aged:
            source = oldest
        elif self._deques[worker]:
            source = worker
        else:  # steal from the longest deque; among equals the one with the older head
            source = max(heads, key=lambda h: (len(self._deques[h[1]]), -h[0]))[1]
        entry = self._deques[source].popleft()
        record = TaskRecord(
            seq=entry.seq,
            placed_on=entry.placed_on,
            taken_by=worker,
            take_index=self._num_taken,
            picks_waited=self._num_taken - entry.takes_at_submit,
            queue_wait_s=max(0.0, now - entry.submitted_at),
            is_stolen=source != worker,
            is_aged=is_aged,
        )
        self._num_taken += 1
        self._num_steals += record.is_stolen
        self._num_aged += is_aged
        self._processed[worker] += 1
        self._inflight[worker] += 1
        self._max_wait_s = max(self._max_wait_s, record.queue_wait_s)
        self._total_wait_s += record.queue_wait_s
        self._max_picks_waited = max(self._max_picks_waited, record.picks_waited)
        self._recent.append(record)
        return Taken(entry.task, record)

    def take(
        self, worker: int, *, block: bool = False, timeout: float | None = None
    ) -> Taken[T] | None:
        """Next task for `worker`, or None: nothing queued (block=False), timeout, or closed and
        drained (block=True)."""
        with self._work:
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                taken = self._pick(worker)
                if taken is not None or not block or self._closed:
                    return taken
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._work.wait(remaining)

    def done(self, worker: int, *, failed: bool = False) -> None:
        with self._work:
            if self._inflight[worker] <= 0:
                raise ConfigError(f"done({worker}) without a task taken by that worker")
            self._inflight[worker] -= 1
            if failed:
                self._num_failed += 1
            else:
                self._num_completed += 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is queued or in flight; False on timeout."""
        with self._idle:
            return self._idle.wait_for(
                lambda: not any(self._deques) and not any(self._inflight), timeout
            )

    def close(self, *, drain: bool = True) -> list[T]:
        """Refuse new tasks. drain=True leaves queued tasks to be taken; drain=False removes and
        returns them (oldest first) so the caller can fail them."""
        with self._work:
            self._closed = True
            dropped: list[_Entry[T]] = []
            if not drain:
                for d in self._deques:
                    dropped.extend(d)
                    d.clear()
            self._work.notify_all()
            self._idle.notify_all()
            return [e.task for e in sorted(dropped, key=lambda e: e.seq)]

    def stats(self) -> PoolStats:
        with self._work:
            return PoolStats(
                num_workers=self.num_workers,
                num_submitted=self._num_submitted,
                num_taken=self._num_taken,
                num_completed=self._num_completed,
                num_failed=self._num_failed,
                num_steals=self._num_steals,
                num_aged_takes=self._num_aged,
                queue_lengths=tuple(len(d) for d in self._deques),
                processed_per_worker=tuple(self._processed),
                max_queue_wait_s=self._max_wait_s,
                total_queue_wait_s=self._total_wait_s,
                max_picks_waited=self._max_picks_waited,
                recent=tuple(self._recent),
            )
