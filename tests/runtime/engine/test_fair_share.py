"""Fair share of the batch (runtime.engine.fair_share, issue 39 item 5), asserted on the
scheduler's steps: which sequences each step admits, not how long anything took."""

from __future__ import annotations

import time

from runtime.engine.fair_share import ShareConfig
from runtime.engine.request import GenerationRequest, RequestHandle
from runtime.engine.sampling import SamplingParams
from runtime.engine.scheduled import SchedulerConfig
from runtime.engine.scheduler import Scheduler
from runtime.engine.sequence import Sequence
from runtime.engine.stats import RequestStats
from tests.runtime.engine.test_scheduler import make_kv, run_step


def seq(rid: str, *, group: str | None = None, tenant: str = "t", first: int = 1) -> Sequence:
    request = GenerationRequest(
        rid, list(range(first, first + 4)), SamplingParams(1000), group=group, tenant=tenant
    )
    return Sequence(
        request=request,
        handle=RequestHandle(rid),
        stats=RequestStats(request_id=rid, model="m"),
        deadline=time.monotonic() + 60,
        stop_checker=None,  # type: ignore[arg-type]  # the scheduler never reads it
    )


def scheduler(request_share: float = 1.0, tenant_share: float = 1.0) -> Scheduler:
    config = SchedulerConfig(64, 100, 10_000, share=ShareConfig(request_share, tenant_share))
    return Scheduler(config, make_kv())


def admitted(steps: list[tuple[str, int]]) -> list[str]:
    """The sequences a step started (their prompt of 4 tokens in one chunk)."""
    return [rid for rid, n in steps if n == 4]


def test_a_chat_goes_ahead_of_the_rest_of_a_big_batch() -> None:
    s = scheduler()
    for k in range(8):  # one body, 8 prompts
        s.add(seq(f"big-{k}", group="big"))
    assert admitted(run_step(s, 4)) == ["big-0", "big-1", "big-2", "big-3"]
    s.add(seq("chat", tenant="t"))  # the same tenant: the batch's group is what ranks it last
    s.finish(s.running[0])
    # the first free slot goes to the chat, not to big-4 which arrived before it
    assert admitted(run_step(s, 4)) == ["chat"]
    assert [q.request_id for q in s.waiting] == ["big-4", "big-5", "big-6", "big-7"]


def test_fifo_without_share_bound_makes_the_chat_wait_for_a_slot() -> None:
    """The share bound is what frees a slot while the batch runs: without it (1.0) the chat
    cannot start until a batch sequence ends; with 0.75 it starts at the next step."""
    for share, expected in ((1.0, []), (0.75, ["chat"])):
        s = scheduler(request_share=share)
        for k in range(8):
            s.add(seq(f"big-{k}", group="big"))
        first = admitted(run_step(s, 4))
        assert first == ["big-0", "big-1", "big-2", "big-3"][: 3 if share < 1 else 4]
        s.add(seq("chat"))
        assert admitted(run_step(s, 4)) == expected
        if share < 1:  # the batch keeps its share and no more while another request runs
            assert sum(q.request.group == "big" for q in s.running) == 3


def test_a_lone_batch_may_start_and_keeps_its_share() -> None:
    s = scheduler(request_share=0.5)
    for k in range(6):
        s.add(seq(f"big-{k}", group="big"))
    assert admitted(run_step(s, 4)) == ["big-0", "big-1"]
    assert admitted(run_step(s, 4)) == []  # its share is 2 of 4 sequences
    s.finish(s.running[0])
    assert admitted(run_step(s, 4)) == ["big-2"]


def test_the_least_served_tenant_goes_first() -> None:
    s = scheduler()
    s.add(seq("a-0", tenant="a"))
    s.add(seq("a-1", tenant="a", first=20))
    assert admitted(run_step(s, 3)) == ["a-0", "a-1"]
    s.add(seq("a-2", tenant="a", first=40))
    s.add(seq("b-0", tenant="b", first=60))  # later, but its tenant has nothing running
    assert admitted(run_step(s, 3)) == ["b-0"]


def test_a_tenant_share_bounds_its_requests_together() -> None:
    s = scheduler(tenant_share=0.5)
    for k in range(4):
        s.add(seq(f"a-{k}", tenant="a", first=10 * k + 1))  # four requests of one tenant
    assert admitted(run_step(s, 4)) == ["a-0", "a-1"]
    s.add(seq("b-0", tenant="b", first=90))
    assert admitted(run_step(s, 4)) == ["b-0"]


def test_a_preempted_sequence_comes_back_first_whatever_its_share() -> None:
    s = scheduler(request_share=0.5)
    for k in range(3):
        s.add(seq(f"big-{k}", group="big", first=10 * k + 1))
    run_step(s, 4)
    victim = s.running[-1]
    s.preempt(victim)
    s.add(seq("chat", first=90))
    steps = run_step(s, 4)
    assert [rid for rid, _ in steps][-2:] == [victim.request_id, "chat"]


def test_turns_alternate_as_a_step_admits() -> None:
    """The counts move with each admission: after the batch's first prompt starts, the chat's
    turn comes before the batch's second, although it arrived after all of them."""
    s = scheduler()
    for k in range(4):
        s.add(seq(f"big-{k}", group="big", first=10 * k + 1))
    s.add(seq("chat", first=90))
    assert admitted(run_step(s, 8)) == ["big-0", "chat", "big-1", "big-2", "big-3"]


def _prioritised(rid: str, priority: int, **kw: object) -> Sequence:
    s = seq(rid, **kw)  # type: ignore[arg-type]
    s.request = GenerationRequest(
        rid,
        s.request.prompt_token_ids,
        s.request.sampling,
        group=s.request.group,
        priority=priority,
    )
    return s


def test_fcfs_never_reads_a_request_priority_and_the_priority_policy_ranks_by_it() -> None:
    """Under fcfs a client's `priority` field orders nothing (the policy is off); under the
    priority policy the fair-share order keeps the policy's order (lower first)."""
    for policy, expected in (("fcfs", ["low", "high"]), ("priority", ["high", "low"])):
        config = SchedulerConfig(64, 100, 10_000, scheduling_policy=policy, priority_aging_s=0)
        s = Scheduler(config, make_kv())
        s.add(_prioritised("busy", 0, group="g"))
        assert admitted(run_step(s, 1)) == ["busy"]  # something runs: fair share orders
        s.add(_prioritised("low", 5, group="a"))
        s.add(_prioritised("high", 0, group="b"))
        assert admitted(run_step(s, 3)) == expected
