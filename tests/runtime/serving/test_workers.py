"""The threaded work-stealing pool. Assertions are on order and counts, never on seconds; the
per-test timeout is the deadlock detector."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from runtime.errors import ServiceUnavailable
from runtime.serving.workers import PoolConfig, WorkStealingPool
from tests.runtime.serving.test_work_queues import max_overtakes

pytestmark = pytest.mark.timeout(30)


class Recorder:
    """Handler that notes who ran what; a tiny sleep releases the GIL like real work would."""

    def __init__(self, work_s: float = 0.0005) -> None:
        self.work_s = work_s
        self.lock = threading.Lock()
        self.ran: list[tuple[int, int]] = []  # (worker, task)

    def __call__(self, worker: int, task: int) -> None:
        time.sleep(self.work_s)
        with self.lock:
            self.ran.append((worker, task))


def test_starvation_skewed_submission_all_finish_with_steals_and_bounded_overtakes() -> None:
    k = 8
    rec = Recorder()
    pool: WorkStealingPool[int] = WorkStealingPool(rec, PoolConfig(num_workers=4, max_overtakes=k))
    for i in range(300):  # everything lands on worker 0 ...
        pool.submit(i, worker=0)
    pool.start()
    for i in range(300, 400):  # ... and keeps landing there while the pool runs
        pool.submit(i, worker=0)
    assert pool.wait_idle(timeout=20)
    pool.shutdown()
    assert sorted(t for _, t in rec.ran) == list(range(400))  # every task exactly once
    stats = pool.stats()
    assert stats.num_completed == 400 and stats.num_failed == 0
    assert stats.num_steals > 0
    assert sum(n > 0 for n in stats.processed_per_worker) >= 2
    assert sum(stats.processed_per_worker) == 400
    assert max_overtakes(stats.recent) <= k
    assert stats.max_picks_waited >= 1 and stats.max_queue_wait_s >= 0.0


def test_flooded_worker_with_fresh_work_elsewhere_is_not_starved() -> None:
    # workers 1..3 keep getting newer tasks of their own; aging still bounds worker 0's backlog
    k = 5
    rec = Recorder(work_s=0.0002)
    pool: WorkStealingPool[int] = WorkStealingPool(rec, PoolConfig(num_workers=4, max_overtakes=k))
    for i in range(200):
        pool.submit(i, worker=0)
    with pool:
        for i in range(200, 500):
            pool.submit(i, worker=1 + i % 3)
        assert pool.wait_idle(timeout=20)
    stats = pool.stats()
    assert stats.num_completed == 500
    assert max_overtakes(stats.recent) <= k
    assert pool.num_alive == 0


def test_concurrent_producers() -> None:
    rec = Recorder(work_s=0.0)
    pool: WorkStealingPool[int] = WorkStealingPool(rec, PoolConfig(num_workers=3))
    pool.start()
    seqs: list[int] = []
    lock = threading.Lock()

    def produce(base: int) -> None:
        mine = [pool.submit(base + i) for i in range(100)]
        with lock:
            seqs.extend(mine)

    producers = [threading.Thread(target=produce, args=(1000 * p,)) for p in range(8)]
    for t in producers:
        t.start()
    for t in producers:
        t.join()
    assert pool.wait_idle(timeout=20)
    pool.shutdown()
    assert sorted(seqs) == list(range(800))
    assert Counter(t for _, t in rec.ran) == Counter(
        1000 * p + i for p in range(8) for i in range(100)
    )


def test_handler_errors_are_counted_and_the_worker_carries_on() -> None:
    errors: list[tuple[int, int, str]] = []

    def handler(worker: int, task: int) -> None:
        if task % 10 == 0:
            raise ValueError(f"bad {task}")

    pool: WorkStealingPool[int] = WorkStealingPool(
        handler, PoolConfig(num_workers=2), on_error=lambda w, t, e: errors.append((w, t, str(e)))
    )
    with pool:
        for i in range(50):
            pool.submit(i)
        assert pool.wait_idle(timeout=20)
    stats = pool.stats()
    assert (stats.num_completed, stats.num_failed) == (45, 5)
    assert sorted(t for _, t, _ in errors) == [0, 10, 20, 30, 40]


def test_shutdown_drain_false_returns_queued_and_stops() -> None:
    gate = threading.Event()
    started = threading.Event()

    def handler(worker: int, task: int) -> None:
        started.set()
        gate.wait(10)

    pool: WorkStealingPool[int] = WorkStealingPool(handler, PoolConfig(num_workers=1))
    pool.start()
    for i in range(5):
        pool.submit(i)
    assert started.wait(10)  # task 0 is running, 1..4 queued
    assert pool.shutdown(drain=False, timeout=0) == [1, 2, 3, 4]
    with pytest.raises(ServiceUnavailable):
        pool.submit(9)
    gate.set()
    assert pool.shutdown(timeout=10) == []
    assert pool.num_alive == 0
    assert pool.stats().num_completed == 1


def test_shutdown_drains_and_never_started_pool_hands_tasks_back() -> None:
    rec = Recorder(work_s=0.0)
    pool: WorkStealingPool[int] = WorkStealingPool(rec, PoolConfig(num_workers=2))
    for i in range(20):
        pool.submit(i)
    pool.start()
    assert pool.shutdown(drain=True, timeout=10) == []
    assert sorted(t for _, t in rec.ran) == list(range(20)) and pool.num_alive == 0

    idle: WorkStealingPool[int] = WorkStealingPool(rec, PoolConfig(num_workers=2))
    idle.submit(7)
    assert idle.shutdown() == [7]
