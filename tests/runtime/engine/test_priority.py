"""Priority scheduling (`scheduling_policy=priority`) from counts alone, on the real paged KV
cache as tests/runtime/engine/test_scheduler.py uses it: admission order by priority (lower
first, FIFO within one), aging, preemption of the lowest priority, and a waiting high-priority
request taking a lower one's pages."""

from __future__ import annotations

import time

from runtime.engine.priority import PriorityPolicy
from runtime.engine.scheduled import SchedulerConfig
from runtime.engine.scheduler import Scheduler
from runtime.engine.sequence import Sequence, SequenceStatus
from tests.runtime.engine.test_scheduler import make_kv, make_seq, run_step, used_pages


def priority_scheduler(kv_pages: int = 1000, aging_s: float = 0.0) -> Scheduler:
    config = SchedulerConfig(
        64, 100, 10_000, scheduling_policy="priority", priority_aging_s=aging_s
    )
    return Scheduler(config, make_kv(kv_pages))


def seq(rid: str, priority: int, num_prompt: int = 4, first: int = 1) -> Sequence:
    s = make_seq(rid, num_prompt, first=first)
    s.request.priority = priority
    s.stats.queued_ts = time.time()
    return s


def test_lower_priority_value_is_admitted_first_fifo_within_one() -> None:
    s = priority_scheduler()
    for rid, p in [("a", 5), ("b", 0), ("c", 5), ("d", -1), ("e", 0)]:
        s.add(seq(rid, p, first=10 * len(s.waiting)))
    admitted = [rid for rid, _ in run_step(s, 2)]
    assert admitted == ["d", "b"]
    s.finish(s.running[0])
    s.finish(s.running[0])
    assert [rid for rid, _ in run_step(s, 3)] == ["e", "a", "c"]


def test_the_default_policy_stays_fifo_whatever_the_priority() -> None:
    s = Scheduler(SchedulerConfig(64, 100, 10_000), make_kv())
    for rid, p in [("a", 5), ("b", 0), ("c", -1)]:
        s.add(seq(rid, p, first=10 * len(s.waiting)))
    assert [rid for rid, _ in run_step(s, 2)] == ["a", "b"]
    assert s.priority is None


def test_aging_lifts_a_long_waiting_request_over_later_better_ones() -> None:
    s = priority_scheduler(aging_s=1.0)
    old = seq("old", 3)
    old.stats.queued_ts = time.time() - 10.0  # waited 10 s: effective priority 3 - 10 = -7
    s.add(old)
    s.add(seq("new", 0, first=50))
    assert [rid for rid, _ in run_step(s, 1)] == ["old"]


def test_no_free_page_preempts_the_lowest_priority_not_the_newest() -> None:
    s = priority_scheduler(kv_pages=3)
    low = seq("low", 9)
    high = seq("high", 0, first=50)
    s.add(low)
    s.add(high)
    run_step(s, 8)
    assert [q.request_id for q in s.running] == ["low", "high"]  # admission order: low first
    assert used_pages(s) == 2
    out = s.schedule(8)  # both need a page for token 5; one is free: high (newest) keeps going
    assert [i.seq for i in out.items] == [high] and out.num_preempted == 1
    assert low.status is SequenceStatus.WAITING and low.num_preemptions == 1
    assert high.num_preemptions == 0


def test_a_waiting_high_priority_request_takes_a_lower_ones_pages() -> None:
    s = priority_scheduler(kv_pages=4)
    low = seq("low", 5, num_prompt=12)  # 3 pages
    s.add(low)
    run_step(s, 8)
    s.add(seq("high", 0, num_prompt=8, first=50))  # 2 pages: no room while low runs
    out = s.schedule(8)
    assert out.num_preempted == 1 and low.status is SequenceStatus.WAITING
    assert [q.request_id for q in s.waiting] == ["low", "high"]  # preempted go to the front
    assert run_step(s, 8)[0][0] == "high"  # next step: high is admitted first
    assert s.running[0].request_id == "high"


def test_an_equal_or_better_running_request_is_not_preempted_for_a_waiting_one() -> None:
    s = priority_scheduler(kv_pages=4)
    s.add(seq("first", 0, num_prompt=12))
    run_step(s, 8)
    s.add(seq("second", 0, num_prompt=8, first=50))
    out = s.schedule(8)
    assert out.num_preempted == 0 and [q.request_id for q in s.waiting] == ["second"]


def test_policy_keys() -> None:
    policy = PriorityPolicy(aging_s=2.0)
    a, b = seq("a", 1), seq("b", 1)
    a.arrival_index, b.arrival_index = 0, 1
    now = a.stats.queued_ts = b.stats.queued_ts = 100.0
    assert policy.key(a, now) < policy.key(b, now)
    assert policy.key(a, now + 4.0)[0] == -1.0  # two levels gained in 4 s
    assert policy.victim([a, b], now) is b  # equal priority: the newest
