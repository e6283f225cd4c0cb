"""Continuous batching gives the same tokens as one-at-a-time greedy generation in `transformers`
(the reference), with chunked prefill, cancellations mid-stream, and a KV budget that forces
requests to wait for room; afterwards no sequence holds allocator blocks."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.engine.request import RequestHandle
from runtime.engine.sampling import SamplingParams
from tests.runtime.engine.support import (
    RecordingSink,
    greedy,
    hf_greedy,
    live_owners,
    make_engine,
    one_torch_thread,
    random_prompts,
    request,
)

NUM_REQUESTS = 64

pytestmark = pytest.mark.usefixtures(one_torch_thread.__name__)


@pytest.fixture(scope="module")
def workload(demo_model_dir) -> tuple[list[list[int]], list[int], list[list[int]]]:
    """64 prompts of 1..70 tokens, 1..24 new tokens each, and the reference continuations."""
    model_dir = demo_model_dir("llama")
    prompts = random_prompts(NUM_REQUESTS, 1, 70, vocab=500, seed=1)
    max_tokens = [1 + (i * 7) % 24 for i in range(NUM_REQUESTS)]
    return prompts, max_tokens, hf_greedy(model_dir, prompts, max_tokens)


def first_output(handle: RequestHandle) -> None:
    """Block until the request has streamed its first token (so a cancel lands mid-stream)."""
    for _ in handle:
        return


@pytest.mark.timeout(240)
def test_64_mixed_requests_match_one_at_a_time_greedy_with_cancellations(
    demo_model_dir, workload
) -> None:
    prompts, max_tokens, expected = workload
    sink = RecordingSink()
    # a 32-token budget chunks every prompt longer than that; 8 sequences at most per step
    engine, _ = make_engine(
        demo_model_dir("llama"),
        sink,
        max_num_batched_tokens=32,
        max_num_seqs=8,
        initial_num_seqs=8,
        min_num_seqs=8,
    )
    cancel_targets = [i for i in range(NUM_REQUESTS) if i % 8 == 3 and max_tokens[i] >= 8]
    try:
        handles = [
            engine.submit(request(f"r{i}", p, greedy(n)))
            for i, (p, n) in enumerate(zip(prompts, max_tokens, strict=True))
        ]
        cancel_ids = set()
        for i in cancel_targets:
            first_output(handles[i])
            if engine.cancel(f"r{i}"):  # False only if it finished before the cancel landed
                cancel_ids.add(i)
        for i, handle in enumerate(handles):
            out = handle.result(timeout=120)  # the whole stream joined
            if i in cancel_ids:
                assert out.finished_reason == "cancelled"
                n = len(out.token_ids)
                assert 1 <= n < max_tokens[i] and out.token_ids == expected[i][:n]
                continue
            assert out.finished_reason == "length"
            assert out.token_ids == expected[i], f"request r{i} (prompt {len(prompts[i])} tokens)"
    finally:
        engine.shutdown(drain_timeout_s=10)
    assert len(cancel_ids) >= len(cancel_targets) // 2  # most cancels land mid-stream
    assert live_owners(engine) == []
    stats = sink.by_id()
    assert {stats[f"r{i}"].finished_reason for i in cancel_ids} == {"cancelled"}
    assert max(s.num_seqs for s in sink.steps) > 1  # requests really were batched
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in sink.steps)  # mixed steps


@pytest.mark.timeout(240)
def test_small_kv_budget_holds_requests_and_outputs_stay_correct(demo_model_dir, workload) -> None:
    prompts, max_tokens, expected = workload
    budget = 64 * 1024
    engine, _ = make_engine(demo_model_dir("llama"), kv_cache_bytes=budget, max_num_seqs=16)
    engine.load()
    kv_cache = engine._parts.kv_cache
    used: list[int] = []  # pages held by sequences after every page request
    ensure = kv_cache.ensure

    def recording_ensure(kv: Any, num_new_tokens: int) -> bool:
        granted = ensure(kv, num_new_tokens)
        used.append(kv_cache.stats().num_used_pages)
        return granted

    kv_cache.ensure = recording_ensure  # type: ignore[method-assign]
    try:
        handles = [
            engine.submit(request(f"k{i}", prompts[i], greedy(max_tokens[i]))) for i in range(24)
        ]
        results = [h.result(timeout=120) for h in handles]
        held = engine._parts.core.scheduler.num_holds
    finally:
        engine.shutdown(drain_timeout_s=10)
    assert [r.token_ids for r in results] == expected[:24]
    assert held > 0, "the budget should have made requests wait for KV room"
    pages = kv_cache.stats().num_pages
    assert (pages + 1) * kv_cache.bytes_per_page <= budget  # the pool (and its zero page) fits
    assert len(used) >= 24 and 0 < max(used) <= pages  # every sequence got pages, within the pool
    assert max(used) > pages // 2  # the budget really was the constraint, not slack
    assert live_owners(engine) == []


@pytest.mark.timeout(120)
def test_seeded_sampling_does_not_depend_on_the_batch(demo_model_dir) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
    prompt = [11, 22, 33, 44]
    engine, _ = make_engine(demo_model_dir("llama"))
    try:
        alone = engine.submit(request("alone", prompt, params)).result(timeout=60).token_ids
        crowd = [
            engine.submit(request(f"c{i}", p, SamplingParams(max_tokens=12, temperature=1.0)))
            for i, p in enumerate(random_prompts(7, 3, 30, vocab=500, seed=3))
        ]
        together = engine.submit(request("together", prompt, params))
        assert together.result(timeout=60).token_ids == alone
        for handle in crowd:
            handle.result(timeout=60)
    finally:
        engine.shutdown(drain_timeout_s=10)


@pytest.mark.timeout(120)
def test_out_of_memory_in_a_step_preempts_the_newest_and_outputs_stay_correct(
    demo_model_dir, workload
) -> None:
    prompts, max_tokens, expected = workload
    sink = RecordingSink()
    engine, hooks = make_engine(demo_model_dir("llama"), sink)
    engine.load()
    hooks().hold()  # queue everything first, so the first steps carry several sequences
    handles = [engine.submit(request(f"o{i}", prompts[i], greedy(max_tokens[i]))) for i in range(6)]
    hooks().oom_once_at_batch = 4
    hooks().release()
    results = [h.result(timeout=60) for h in handles]
    core = engine._parts.core
    engine.shutdown(drain_timeout_s=10)
    assert [r.token_ids for r in results] == expected[:6]
    assert core.num_preemptions == 1
    assert not any(r.failure_reason for r in sink.finished)
    assert live_owners(engine) == []
