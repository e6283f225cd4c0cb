"""Scheduler decisions from counts alone (no model): budget, chunked prefill, sequence cap, FIFO
hold, pages on demand, preemption of the newest, prefix reuse. The KV space is the real paged
cache with one-float pages, so page accounting is the production code's."""

from __future__ import annotations

import time

import torch

from runtime.engine.request import GenerationRequest, RequestHandle
from runtime.engine.sampling import SamplingParams
from runtime.engine.scheduled import SchedulerConfig
from runtime.engine.scheduler import Scheduler
from runtime.engine.sequence import Sequence, SequenceStatus
from runtime.engine.stats import RequestStats
from runtime.memory import Allocator
from runtime.memory.kv_cache import KVCache

BLOCK = 4


def make_kv(
    num_pages: int = 1000, prefix_caching: bool = False, cls: type[KVCache] = KVCache
) -> KVCache:
    """`num_pages` usable pages of BLOCK tokens (4 bytes a token: one layer, one head, dim 1)."""
    return cls(
        num_layers=1,
        num_kv_heads=1,
        head_dim=1,
        dtype=torch.float16,
        device="cpu",
        allocator=Allocator(device="cpu"),
        max_bytes=(num_pages + 1) * BLOCK * 4,
        page_size=BLOCK,
        enable_prefix_caching=prefix_caching,
    )


def make_seq(rid: str, num_prompt: int, max_tokens: int = 4, first: int = 1) -> Sequence:
    prompt = list(range(first, first + num_prompt))
    request = GenerationRequest(rid, prompt, SamplingParams(max_tokens))
    return Sequence(
        request=request,
        handle=RequestHandle(rid),
        stats=RequestStats(request_id=rid, model="m"),
        deadline=time.monotonic() + 60,
        stop_checker=None,  # type: ignore[arg-type]  # the scheduler never reads it
    )


def make_scheduler(
    budget: int = 64, kv_pages: int = 1000, queue: int = 100, **kv_args: bool
) -> Scheduler:
    return Scheduler(SchedulerConfig(budget, queue, 10_000), make_kv(kv_pages, **kv_args))


def run_step(scheduler: Scheduler, max_num_seqs: int) -> list[tuple[str, int]]:
    """One schedule; pretend the forward ran (cursor + prefix keys) and every sampling chunk
    produced token 7."""
    out = scheduler.schedule(max_num_seqs)
    samples = [item.samples for item in out.items]  # before the cursors move
    for item in out.items:
        seq = item.seq
        assert (
            seq.kv is not None and seq.kv.capacity >= seq.num_computed_tokens + item.num_new_tokens
        )
    scheduler.update_from_output(out)
    for item, sampled in zip(out.items, samples, strict=True):
        if sampled:
            item.seq.output_token_ids.append(7)
    return [(item.seq.request_id, item.num_new_tokens) for item in out.items]


def used_pages(s: Scheduler) -> int:
    return s.kv_stats().num_used_pages


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


def test_pages_are_taken_as_the_sequence_grows_not_for_max_tokens() -> None:
    s = make_scheduler(kv_pages=10)
    s.add(make_seq("a", 5, max_tokens=10_000))  # the old policy could never have started it
    run_step(s, 8)
    assert used_pages(s) == 2  # 5 tokens in pages of 4
    for _ in range(3):  # tokens 6, 7, 8 of the sequence: still page 2
        run_step(s, 8)
    assert used_pages(s) == 2
    run_step(s, 8)  # the 9th token needs a third page
    assert used_pages(s) == 3


def test_no_room_holds_the_queue_head_and_nobody_overtakes() -> None:
    s = make_scheduler(kv_pages=6)
    s.add(make_seq("big1", 16))  # 4 pages
    s.add(make_seq("big2", 12))  # 3 pages: not next to big1 (+ 1 page of headroom for it)
    s.add(make_seq("small", 1))  # 1 page would fit, but must not overtake big2
    assert [rid for rid, _ in run_step(s, 8)] == ["big1"]
    assert s.num_holds == 1 and [q.request_id for q in s.waiting] == ["big2", "small"]
    s.finish(s.running[0])
    assert used_pages(s) == 0
    assert [rid for rid, _ in run_step(s, 8)] == ["big2", "small"]


def test_no_free_page_preempts_the_newest_even_when_it_is_the_one_asking() -> None:
    s = make_scheduler(kv_pages=3)
    s.add(make_seq("old", 4))
    s.add(make_seq("new", 4, first=50))  # 1 page + 1 page of headroom for old: fits
    run_step(s, 8)
    old, new = s.running
    assert used_pages(s) == 2
    out = s.schedule(8)  # both decode token 5: old takes the last page, new finds none
    assert [i.seq for i in out.items] == [old] and out.num_preempted == 1
    assert new.status is SequenceStatus.WAITING and new.kv is None and new.num_preemptions == 1
    assert list(s.waiting) == [new] and s.num_preemptions == 1 == s.kv_stats().num_preemptions
    assert new.num_computed_tokens == 0 and new.num_pending_tokens == 5
    s.finish(old)
    assert run_step(s, 8) == [("new", 5)]  # recompute: prompt + its output, then sample


def test_a_victim_already_scheduled_this_step_is_unscheduled() -> None:
    s = make_scheduler(kv_pages=3)
    s.add(make_seq("x", 2))
    s.add(make_seq("y", 2, first=50))
    run_step(s, 8)
    run_step(s, 8)
    x, y = s.running  # both at 3 of 4 tokens in their one page; one page free
    x.output_token_ids += [1] * 6  # x has 7 to feed: 2 more pages
    out = s.schedule(8)  # y's decode goes first, then x preempts y, the newest
    assert [i.seq for i in out.items] == [x] and out.num_preempted == 1
    assert out.num_decode_tokens == 0 and out.num_prefill_tokens == 7
    assert y.status is SequenceStatus.WAITING and y.kv is None
    assert x.kv is not None and len(x.kv.page_ids) == 3


def test_admission_bounds_and_finish_frees_kv() -> None:
    s = Scheduler(SchedulerConfig(64, 2, 25), make_kv())
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
    assert seq.status is SequenceStatus.FINISHED and seq.kv is None and used_pages(s) == 0


def test_preempted_sequence_recomputes_prompt_and_outputs() -> None:
    s = make_scheduler(budget=64)
    s.add(make_seq("a", 5))
    run_step(s, 4)
    run_step(s, 4)
    seq = s.running[0]
    assert seq.output_token_ids == [7, 7]
    s.preempt(seq)
    assert seq.kv is None and used_pages(s) == 0
    # recompute feeds prompt + both outputs, then samples the next token
    assert run_step(s, 4) == [("a", 7)]
    assert seq.output_token_ids == [7, 7, 7]


def test_a_shared_prefix_is_reused_and_counted_once_per_request() -> None:
    s = make_scheduler(prefix_caching=True)
    s.add(make_seq("a", 10))
    run_step(s, 4)  # a's pages 1 and 2 are full and keyed
    s.add(make_seq("b", 10))  # the same 10 tokens
    assert run_step(s, 4) == [("a", 1), ("b", 2)]  # b reuses 8 tokens, computes its last 2
    b = s.running[1]
    assert b.stats.cached_tokens == 8 and b.kv is not None and b.kv.num_cached_tokens == 8
    assert b.kv.page_ids[:2] == s.running[0].kv.page_ids[:2]  # type: ignore[union-attr]
    stats = s.kv_stats()
    assert (stats.prefix_query_tokens, stats.prefix_hit_tokens) == (20, 8)
    s.preempt(b)  # its recompute finds its own pages again, but is not a new query
    run_step(s, 4)
    assert b.num_computed_tokens == 11 and s.kv_stats().prefix_query_tokens == 20


def test_reservation_emulation_takes_prompt_plus_max_tokens_up_front() -> None:
    s = Scheduler(SchedulerConfig(64, 100, 10_000, reserve_full_sequence=True), make_kv(10))
    s.add(make_seq("a", 5, max_tokens=20))  # 25 tokens: 7 pages
    s.add(make_seq("b", 5, max_tokens=20))
    assert [rid for rid, _ in run_step(s, 8)] == ["a"]
    assert used_pages(s) == 7 and s.num_holds == 1


class CountingKV(KVCache):
    """The real cache, counting the calls that take and give back pages."""

    calls: list[str]

    def allocate(self, seq_id, token_ids, salt=""):  # type: ignore[no-untyped-def]
        self.calls.append(f"allocate {seq_id}")
        return super().allocate(seq_id, token_ids, salt)

    def free(self, seq_id):  # type: ignore[no-untyped-def]
        self.calls.append(f"free {seq_id}")
        super().free(seq_id)


def test_a_held_head_is_probed_never_allocated_and_freed_again() -> None:
    """Admission asks the cache first (`probe`): a head without room takes nothing, not even
    the cached prefix pages it would start from, and frees nothing."""
    cache = make_kv(6, prefix_caching=True, cls=CountingKV)
    assert isinstance(cache, CountingKV)
    cache.calls = []
    s = Scheduler(SchedulerConfig(64, 100, 10_000), cache)
    s.add(make_seq("a", 9))  # 3 pages, 2 of them full and keyed after its prefill
    run_step(s, 8)
    s.add(make_seq("b", 20))  # its first 8 tokens are a's: a hit of 2 pages, 3 more wanted
    for _ in range(3):
        run_step(s, 8)
    assert cache.calls == ["allocate a"] and s.num_holds == 3  # held, nothing taken or freed
    assert s.kv_stats().num_shared_pages == 0  # the prefix pages were never held for b
    s.finish(s.running[0])  # a's pages stay cached: its third filled up while b waited
    assert [rid for rid, _ in run_step(s, 8)] == ["b"]
    assert cache.calls == ["allocate a", "free a", "allocate b"]
    b = s.running[0]
    # 2 whole pages, then the one token (9) b shares with a's third page, copied
    assert b.stats.cached_tokens == 9 and b.num_computed_tokens == 20  # one cursor: the KV's


def test_a_binding_limit_reports_how_long_the_head_of_the_queue_has_waited() -> None:
    s = make_scheduler()
    for i in range(3):
        s.add(make_seq(f"r{i}", 3))
    s.waiting[0].stats.queued_ts = time.time() - 5.0  # r0 arrived 5 s ago
    s.waiting[1].stats.queued_ts = time.time() - 4.0
    first = s.schedule(1)  # r0 is admitted; r1 waits at the limit
    assert first.limit_binds and 3.9 < first.queue_wait_s < 30.0
    s.update_from_output(first)
    roomy = s.schedule(8)  # the limit no longer binds: no wait is reported
    assert not roomy.limit_binds and roomy.queue_wait_s == 0.0


def test_a_head_that_ran_before_reports_no_wait_for_a_place() -> None:
    # a preempted sequence (or a fork) back at the head waits for KV pages, not for the limit:
    # growing the limit would not help it, so its old arrival time does not count
    s = make_scheduler()
    for i in range(3):
        s.add(make_seq(f"r{i}", 3))
        s.waiting[-1].stats.queued_ts = time.time() - 5.0
    s.waiting[1].stats.scheduled_ts = time.time() - 4.0  # r1 ran, then went back to the queue
    first = s.schedule(1)  # r0 admitted, r1 at the head
    assert first.limit_binds and first.queue_wait_s == 0.0
