"""Request features on a tensor-parallel engine (TP=2, gloo, two CPU processes) whose KV pool
is too small for its batch, so sequences are preempted and recomputed on every rank: sampled
and prompt logprobs (with their top entries) and greedy tokens equal the one-process engine's,
and constrained outputs (JSON schema, regex, choice, among unconstrained rows) parse.
(`n` and the prefix cache under TP: tests/runtime/engine/test_tp.py.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runtime.engine.engine import Engine
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from tests.runtime.engine.support import engine_config, live_owners, one_torch_thread
from tests.runtime.engine.support import random_prompts as make_prompts
from tests.runtime.engine.test_constraints import run_mixed
from tests.runtime.engine.test_paged_parity import TINY_PAGE_BYTES

__all__ = ["one_torch_thread"]  # the fixture, imported for use here

TOL = 1e-4
# rank 0 holds one of the tiny llama's two KV heads: a page is half TINY_PAGE_BYTES, so this is
# test_constraints' preemption budget (13 pages: a JSON row's 180 tokens fit alone) for 8 or 12
# sequences of up to 84 or 180 tokens
SMALL_POOL = 14 * TINY_PAGE_BYTES // 2


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Two processes on a shared 2-core machine: one intra-op thread each."""


@pytest.fixture(scope="module")
def engines(demo_model_dir: Callable[[str], Path]) -> Iterator[tuple[Engine, Engine]]:
    common = {"model_path": demo_model_dir("llama"), "batch_warmup": False, "num_threads": 1}
    one = Engine(engine_config(**common, kv_cache_bytes=4 << 20))
    two = Engine(
        engine_config(
            **common,
            kv_cache_bytes=SMALL_POOL,
            tensor_parallel_size=2,
            max_num_batched_tokens=16,
            initial_num_seqs=8,
            min_num_seqs=8,
        )
    )
    yield one, two
    two.shutdown()
    one.shutdown()


def test_logprobs_and_tokens_match_one_process_across_preemption(
    engines: tuple[Engine, Engine],
) -> None:
    one, two = engines
    prompts = make_prompts(8, 30, 60, one.loaded.args.vocab_size, seed=9)
    params = SamplingParams(
        max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=2, prompt_logprobs=1
    )

    def run(engine: Engine) -> list:
        handles = [
            engine.submit(GenerationRequest(f"lp-{i}", p, params)) for i, p in enumerate(prompts)
        ]
        return [h.result(timeout=300) for h in handles]

    expected, got = run(one), run(two)
    assert two.kv_cache_stats().num_preemptions > 0, "the pool should force preemption"
    assert two.kv_cache_stats().num_pages == 13
    for want, out in zip(expected, got, strict=True):
        assert out.token_ids == want.token_ids
        assert len(out.logprobs) == 24 and len(out.prompt_logprobs) == len(want.prompt_logprobs)
        for a, b in zip(
            out.logprobs + out.prompt_logprobs[1:],
            want.logprobs + want.prompt_logprobs[1:],
            strict=True,
        ):
            assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < TOL
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
    assert two.kv_cache_stats().num_used_pages == 0 and live_owners(two) == []


def test_constrained_outputs_parse_under_tp(engines: tuple[Engine, Engine]) -> None:
    _, two = engines
    preempted = two.kv_cache_stats().num_preemptions
    run_mixed(two, list(range(3, 23)), seed=7)  # asserts each constrained output parses
    assert two.kv_cache_stats().num_preemptions > preempted  # and they were preempted too
    assert two.kv_cache_stats().num_used_pages == 0
