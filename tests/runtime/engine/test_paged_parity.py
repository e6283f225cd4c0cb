"""Paged KV end to end: 64 mixed requests (prompts sharing prefixes, chunked prefill, requests
joining mid-flight, cancellations) give greedy tokens identical to `transformers` and to the same
engine run one request at a time, with prefix caching on (whole pages and parts of pages), off,
and with a page budget so small that running sequences are preempted and recomputed. After the
drain no page is held."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from runtime.engine.request import TokenOutput
from tests.runtime.engine.support import (
    RecordingSink,
    greedy,
    hf_greedy,
    live_owners,
    make_engine,
    one_torch_thread,
    request,
)

NUM_REQUESTS = 64
CANCELLED = {i for i in range(NUM_REQUESTS) if i % 9 == 4}  # cancelled after their 1st token
TINY_PAGE_BYTES = 2 * 2 * 2 * 16 * 4 * 16  # tiny llama: 2 layers, K+V, 2 kv heads x 16, fp32

pytestmark = pytest.mark.usefixtures(one_torch_thread.__name__)


@pytest.fixture(scope="module")
def workload(demo_model_dir) -> tuple[list[list[int]], list[int], list[list[int]]]:
    """Prompts of 2..68 tokens cut from three shared prefixes plus a unique tail; 4..23 new
    tokens each; and the transformers continuations."""
    g = torch.Generator().manual_seed(5)
    prefixes = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (20, 36, 48)]
    prompts, max_tokens = [], []
    for i in range(NUM_REQUESTS):
        prefix = prefixes[i % 3]
        cut = int(torch.randint(1, len(prefix) + 1, (1,), generator=g))
        tail = torch.randint(3, 500, (int(torch.randint(1, 21, (1,), generator=g)),), generator=g)
        prompts.append(prefix[:cut] + tail.tolist())
        max_tokens.append(4 + (i * 5) % 20)
    return prompts, max_tokens, hf_greedy(demo_model_dir("llama"), prompts, max_tokens)


def run(model_dir: Any, prompts: list[list[int]], max_tokens: list[int], **config: Any):
    """Half the requests, then (once one has finished) the other half; cancel CANCELLED after
    their first token. Returns outputs, the ids whose cancel landed, the engine and its sink."""
    sink = RecordingSink()
    engine, _ = make_engine(model_dir, sink, max_num_batched_tokens=32, **config)
    outputs: dict[int, TokenOutput] = {}
    landed: set[int] = set()
    try:
        handles = {}
        for wave in (range(0, 32), range(32, NUM_REQUESTS)):
            for i in wave:
                handles[i] = engine.submit(request(f"r{i}", prompts[i], greedy(max_tokens[i])))
            next(iter(handles[wave[0]]))  # the wave has started streaming
            for i in sorted(CANCELLED.intersection(wave)):
                next(iter(handles[i]))
                if engine.cancel(f"r{i}"):  # False when it finished before the cancel landed
                    landed.add(i)
        outputs = {i: h.result(timeout=120) for i, h in handles.items()}
    finally:
        engine.shutdown(drain_timeout_s=10)
    return outputs, landed, engine.kv_cache_stats(), engine, sink


@pytest.fixture(scope="module")
def one_at_a_time(demo_model_dir, workload) -> list[list[int]]:
    prompts, max_tokens, _ = workload
    engine, _ = make_engine(
        demo_model_dir("llama"),
        max_num_seqs=1,
        min_num_seqs=1,
        initial_num_seqs=1,
        enable_prefix_caching=False,
    )
    try:
        handles = [
            engine.submit(request(f"s{i}", p, greedy(n)))
            for i, (p, n) in enumerate(zip(prompts, max_tokens, strict=True))
        ]
        return [h.result(timeout=120).token_ids for h in handles]
    finally:
        engine.shutdown(drain_timeout_s=10)


CASES = {
    "prefix-caching-on": {"enable_prefix_caching": True, "max_num_seqs": 16},
    "prefix-caching-off": {"enable_prefix_caching": False, "max_num_seqs": 16},
    # 8 pages of 16 tokens for 16 sequences of up to 91 tokens: preemption is unavoidable (10
    # pages forced 7 preemptions a run with whole pages reused, and 1 once parts of pages were:
    # too close to none; 8 pages force 8)
    "preemption": {"kv_cache_bytes": 9 * TINY_PAGE_BYTES, "max_num_seqs": 16},
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", sorted(CASES))
def test_64_mixed_requests_match_transformers_and_one_at_a_time(
    case: str, demo_model_dir, workload, one_at_a_time
) -> None:
    prompts, max_tokens, expected = workload
    assert one_at_a_time == expected  # the engine alone agrees with the reference
    config = {"initial_num_seqs": 16, "min_num_seqs": 16, **CASES[case]}
    outputs, landed, kv, engine, sink = run(demo_model_dir("llama"), prompts, max_tokens, **config)
    for i, out in outputs.items():
        if i in landed:
            n = len(out.token_ids)
            assert out.finished_reason == "cancelled" and out.token_ids == expected[i][:n]
        else:
            assert out.finished_reason == "length"
            assert out.token_ids == expected[i], f"r{i} (prompt {len(prompts[i])} tokens)"
    assert len(landed) >= len(CANCELLED) // 2  # most cancels land mid-stream
    assert max(s.num_seqs for s in sink.steps) > 1
    cached = [out.cached_tokens for out in outputs.values()]
    if case == "prefix-caching-off":
        assert kv.prefix_hit_tokens == 0 and not any(cached)
    else:
        assert kv.prefix_hit_tokens > 0 and sum(cached) > 0
        # prompts cut anywhere from shared prefixes: some reuse part of a page (its first
        # tokens copied, docs/kv_cache.md), and still decode exactly what transformers does
        assert any(c % 16 for c in cached), cached
        by_id = sink.by_id()
        assert sum(r.cached_tokens for r in by_id.values()) == kv.prefix_hit_tokens
    if case == "preemption":
        assert kv.num_preemptions > 0, "the page budget should have forced preemptions"
        assert kv.num_pages == 8
    # drained: every page free or cached, and the allocator names no request
    assert kv.num_used_pages == 0
    assert live_owners(engine) == []
