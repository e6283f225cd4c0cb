"""The stealing/aging policy, driven single-threaded through scripted interleavings so the bounds
are checked exactly (the threaded pool is tested in test_workers.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from runtime.errors import ConfigError, Overloaded, ServiceUnavailable
from runtime.serving.work_queues import PoolConfig, StealingQueues, TaskRecord


def max_overtakes(records: Sequence[TaskRecord]) -> int:
    """Largest number of later-submitted tasks taken before a task (from the take order)."""
    order = sorted(records, key=lambda r: r.take_index)
    worst = 0
    taken_seqs: list[int] = []
    for r in order:
        # tasks already taken with a larger seq overtook r
        worst = max(worst, sum(s > r.seq for s in taken_seqs))
        taken_seqs.append(r.seq)
    return worst


def skewed_run(config: PoolConfig, *, slow_every: int = 4) -> list[TaskRecord]:
    """Worker 0 gets 200 tasks, then workers 1..3 get 50 each (all later in submission order).
    Workers 1..3 take every round, worker 0 only every `slow_every` rounds (a slow replica)."""
    q: StealingQueues[int] = StealingQueues(config)
    for i in range(200):
        q.put(i, worker=0)
    for w in (1, 2, 3):
        for i in range(50):
            q.put(1000 * w + i, worker=w)
    seen: list[int] = []
    rnd = 0
    while len(q):
        for w in range(4):
            if w == 0 and rnd % slow_every:
                continue
            taken = q.take(w)
            if taken is not None:
                seen.append(taken.task)
                q.done(w)
        rnd += 1
    assert sorted(seen) == sorted(
        [*range(200), *(1000 * w + i for w in (1, 2, 3) for i in range(50))]
    )
    stats = q.stats()
    assert stats.num_taken == stats.num_completed == 350
    return list(stats.recent)


@pytest.mark.parametrize("k", [0, 3, 8, 32])
def test_aging_bounds_overtakes_under_skew(k: int) -> None:
    records = skewed_run(PoolConfig(num_workers=4, max_overtakes=k))
    assert max_overtakes(records) <= k
    assert any(r.is_stolen for r in records)


def test_without_aging_the_flooded_worker_starves() -> None:
    # the negative control: the bound above is the aging rule's doing, not the scenario's
    records = skewed_run(PoolConfig(num_workers=4, max_overtakes=None))
    assert max_overtakes(records) > 100


def test_zero_overtakes_is_global_fifo() -> None:
    records = skewed_run(PoolConfig(num_workers=4, max_overtakes=0), slow_every=3)
    assert [r.seq for r in sorted(records, key=lambda r: r.take_index)] == list(range(350))


def test_idle_worker_steals_oldest_from_longest_deque() -> None:
    q: StealingQueues[str] = StealingQueues(PoolConfig(num_workers=3, max_overtakes=None))
    q.put("a0", worker=0)
    for name in ("b0", "b1", "b2"):
        q.put(name, worker=1)
    taken = q.take(2)
    assert taken is not None and taken.task == "b0" and taken.record.is_stolen
    taken = q.take(0)
    assert taken is not None and taken.task == "a0" and not taken.record.is_stolen
    stats = q.stats()
    assert stats.num_steals == 1 and stats.queue_lengths == (0, 2, 0)
    assert stats.processed_per_worker == (1, 0, 1)


def test_time_aging_on_a_virtual_clock() -> None:
    now = [0.0]
    q: StealingQueues[str] = StealingQueues(
        PoolConfig(num_workers=2, max_overtakes=None, max_wait_s=5.0), clock=lambda: now[0]
    )
    q.put("old", worker=0)
    order = []
    for t in range(1, 10):
        now[0] = float(t)
        q.put(f"new{t}", worker=1)
        taken = q.take(1)  # worker 1 prefers its own deque until "old" has waited 5 s
        assert taken is not None
        order.append(taken.task)
        q.done(1)
    assert order[:4] == ["new1", "new2", "new3", "new4"]
    assert order[4] == "old"
    rec = next(r for r in q.stats().recent if r.seq == 0)
    assert rec.is_aged and rec.is_stolen and rec.queue_wait_s == 5.0
    assert q.stats().max_queue_wait_s == 5.0


def test_placement_is_least_loaded_round_robin() -> None:
    q: StealingQueues[int] = StealingQueues(PoolConfig(num_workers=4))
    placed = [q.put(i) for i in range(8)]
    assert placed == list(range(8))
    assert q.stats().queue_lengths == (2, 2, 2, 2)
    assert q.take(0) is not None
    q.put(98)  # worker 0: 1 queued + 1 in flight ties with the others; the cursor is at 0
    assert q.stats().queue_lengths == (2, 2, 2, 2)
    q.done(0)
    q.put(99)  # now worker 1 (the cursor moved on) has 2+0, worker 0 2+0: tie -> worker 1
    assert q.stats().queue_lengths == (2, 3, 2, 2)
    assert q.take(2) is not None and q.take(2) is not None
    q.put(100)  # worker 2 is the least loaded (0 queued + 2 in flight)
    assert q.stats().queue_lengths == (2, 3, 1, 2)


def test_errors_and_close() -> None:
    q: StealingQueues[int] = StealingQueues(PoolConfig(num_workers=2, max_queued=3))
    for i in range(3):
        q.put(i, worker=1)
    with pytest.raises(Overloaded):
        q.put(3)
    with pytest.raises(ConfigError):
        q.put(4, worker=2)
    with pytest.raises(ConfigError):
        q.done(0)  # nothing in flight
    assert q.close(drain=False) == [0, 1, 2]
    with pytest.raises(ServiceUnavailable):
        q.put(5)
    assert q.take(0, block=True) is None  # closed and empty: no wait
    with pytest.raises(ConfigError):
        PoolConfig(num_workers=0)
