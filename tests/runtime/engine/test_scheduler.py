"""Scheduler decisions from counts alone: budget, chunked prefill, sequence cap, FIFO hold."""

from __future__ import annotations

import time

from runtime.engine.request import GenerationRequest, RequestHandle
from runtime.engine.sampling import SamplingParams
from runtime.engine.scheduler import Scheduler, SchedulerConfig
from runtime.engine.sequence import Sequence, SequenceStatus
from runtime.engine.stats import RequestStats
from runtime.memory.kv_cache import SequenceKV


class FakeKV:
    """Room for `capacity_tokens` tokens in total; records what is live."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self.live: dict[str, int] = {}

    def allocate(self, seq_id: str, num_tokens: int) -> SequenceKV | None:
        if sum(self.live.values()) + num_tokens > self.capacity_tokens:
            return None
        self.live[seq_id] = num_tokens
        return SequenceKV.empty(1, 1, 1, num_tokens)

    def free(self, seq_id: str) -> None:
        del self.live[seq_id]


def make_seq(rid: str, num_prompt: int, max_tokens: int = 4) -> Sequence:
    request = GenerationRequest(rid, list(range(1, num_prompt + 1)), SamplingParams(max_tokens))
    return Sequence(
        request=request,
        handle=RequestHandle(rid),
        stats=RequestStats(request_id=rid, model="m"),
        deadline=time.monotonic() + 60,
        stop_checker=None,  # type: ignore[arg-type]  # the scheduler never reads it
    )


def make_scheduler(budget: int = 64, kv_tokens: int = 10_000, queue: int = 100) -> Scheduler:
    return Scheduler(SchedulerConfig(budget, queue, 10_000), FakeKV(kv_tokens))


def run_step(scheduler: Scheduler, max_num_seqs: int) -> list[tuple[str, int]]:
    """One schedule; pretend the forward ran and every sampling chunk produced token 7."""
    out = scheduler.schedule(max_num_seqs)
    for item in out.items:
        samples = item.samples
        item.seq.num_computed_tokens += item.num_new_tokens
        if samples:
            item.seq.output_token_ids.append(7)
    return [(item.seq.request_id, item.num_new_tokens) for item in out.items]


def test_long_prompt_is_prefilled_in_chunks_within_the_budget() -> None:
    s = make_scheduler(budget=16)
    s.add(make_seq("long", 40))
    assert run_step(s, 8) == [("long", 16)]
    assert run_step(s, 8) == [("long", 16)]
    seq = s.running[0]
    assert seq.output_token_ids == []  # no token sampled before the whole prompt is in
    assert run_step(s, 8) == [("long", 8)]
    assert seq.output_token_ids == [7]
    assert run_step(s, 8) == [("long", 1)]  # decode


def test_decodes_go_first_and_new_sequences_join_between_steps() -> None:
    s = make_scheduler(budget=10)
    s.add(make_seq("a", 4))
    assert run_step(s, 8) == [("a", 4)]
    s.add(make_seq("b", 20))
    # a decodes (1 token), b gets the 9 budget tokens left
    assert run_step(s, 8) == [("a", 1), ("b", 9)]
    assert run_step(s, 8) == [("a", 1), ("b", 9)]
    assert run_step(s, 8) == [("a", 1), ("b", 2)]


def test_sequence_cap_limits_running_and_queue_keeps_fifo() -> None:
    s = make_scheduler()
    for i in range(5):
        s.add(make_seq(f"r{i}", 3))
    assert [rid for rid, _ in run_step(s, 2)] == ["r0", "r1"]
    assert s.num_running == 2 and [q.request_id for q in s.waiting] == ["r2", "r3", "r4"]
    s.finish(s.running[0])
    assert [rid for rid, _ in run_step(s, 2)] == ["r1", "r2"]


def test_no_kv_room_holds_the_queue_head_and_nobody_overtakes() -> None:
    s = make_scheduler(kv_tokens=20)
    s.add(make_seq("big1", 10, max_tokens=6))  # needs 16
    s.add(make_seq("big2", 10, max_tokens=6))  # needs 16: does not fit next to big1
    s.add(make_seq("small", 1, max_tokens=1))  # would fit, but must not overtake big2
    assert [rid for rid, _ in run_step(s, 8)] == ["big1"]
    assert s.num_holds == 1 and [q.request_id for q in s.waiting] == ["big2", "small"]
    s.finish(s.running[0])
    assert s.kv.live == {}  # type: ignore[attr-defined]
    assert [rid for rid, _ in run_step(s, 8)] == ["big2", "small"]  # 16 + 2 <= 20


def test_admission_bounds_and_finish_frees_kv() -> None:
    s = Scheduler(SchedulerConfig(64, 2, 25), FakeKV(1000))
    assert s.admission_refusal(10) is None
    s.add(make_seq("a", 10))
    s.add(make_seq("b", 10))
    assert "full" in (s.admission_refusal(1) or "")
    s.finish(s.waiting[1])
    assert "tokens" in (s.admission_refusal(16) or "")
    assert s.admission_refusal(15) is None
    run_step(s, 4)
    seq = s.running[0]
    s.finish(seq)
    assert seq.status is SequenceStatus.FINISHED and seq.kv is None and s.kv.live == {}  # type: ignore[attr-defined]


def test_preempted_sequence_recomputes_prompt_and_outputs() -> None:
    s = make_scheduler(budget=64)
    s.add(make_seq("a", 5))
    run_step(s, 4)
    run_step(s, 4)
    seq = s.running[0]
    assert seq.output_token_ids == [7, 7]
    s.preempt(seq)
    assert seq.kv is None and s.kv.live == {}  # type: ignore[attr-defined]
    # recompute feeds prompt + both outputs, then samples the next token
    assert run_step(s, 4) == [("a", 7)]
    assert seq.output_token_ids == [7, 7, 7]
