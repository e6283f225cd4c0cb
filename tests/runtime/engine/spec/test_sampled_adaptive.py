"""Sampled requests through a speculating engine (seeded ones repeatable, every page back), and
the per-request switch-off when acceptance says drafting loses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.engine.engine import Engine
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.engine.spec.config import SpecConfig
from runtime.engine.spec.state import SpecState
from runtime.memory import Allocator
from runtime.models.loader import load_model
from tests.runtime.engine.support import RecordingSink, engine_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")
from tests.runtime.engine.support import one_torch_thread  # noqa: E402,F401  (the fixture)


@pytest.mark.parametrize("method", ["ngram", "self_draft"])
def test_seeded_sampled_requests_repeat_and_release_their_pages(
    demo_model_dir: Callable[[str], Path], method: str
) -> None:
    loaded = load_model(demo_model_dir("llama"), device="cpu")
    # ngram_min 1: sampled text rarely repeats two tokens of the prompt, one is enough to draft
    spec = SpecConfig(
        method=method, num_speculative_tokens=4, max_batch_for_speculation=64, ngram_min=1
    )
    prompts = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 10, [40] * 20]
    params = [
        SamplingParams(max_tokens=24, temperature=0.7, seed=3, ignore_eos=True),
        SamplingParams(max_tokens=24, temperature=1.0, top_k=5, seed=4, ignore_eos=True),
        SamplingParams(max_tokens=24, temperature=0.5, top_p=0.9, seed=5, ignore_eos=True),
    ]
    runs = []
    sink = RecordingSink()
    for _ in range(2):
        engine = Engine(
            engine_config(batch_warmup=False, spec=spec),
            sink,
            loader=lambda: loaded,
            allocator=Allocator(device="cpu"),
        )
        try:
            handles = [
                engine.submit(GenerationRequest(f"s{i}", prompt, p))
                for i, (prompt, p) in enumerate(zip(prompts, params, strict=True))
            ]
            runs.append([h.result().token_ids for h in handles])
            assert engine.kv_cache_stats().num_used_pages == 0
        finally:
            engine.shutdown()
    assert runs[0] == runs[1]  # a seed draws from its own generator: the same tokens again
    vocab = loaded.args.vocab_size
    assert all(len(ids) == 24 and all(0 <= t < vocab for t in ids) for ids in runs[0])
    assert sum(s.num_draft_tokens for s in sink.steps) > 0


def test_a_request_that_loses_pauses_drafting_longer_each_time() -> None:
    state = SpecState(enabled=True)
    state.observe(4, 0, min_ratio=0.25, min_drafts=8)  # 4 drafted: too few to judge yet
    assert state.may_draft()
    state.observe(4, 1, min_ratio=0.25, min_drafts=8)  # recent acceptance 0.125 < 0.25
    assert (state.num_draft_tokens, state.num_accepted_tokens, state.num_emitted_tokens) == (
        8,
        1,
        3,
    )
    paused = [state.may_draft() for _ in range(8)]
    assert paused == [False] * 8 and state.may_draft()  # 8 decode steps off, then back
    state.observe(4, 0, min_ratio=0.25, min_drafts=8)
    state.observe(4, 0, min_ratio=0.25, min_drafts=8)
    assert sum(not state.may_draft() for _ in range(20)) == 16  # the second pause is twice as long
    paying = SpecState(enabled=True)
    for _ in range(8):
        paying.observe(4, 3, min_ratio=0.25, min_drafts=8)
    assert paying.may_draft() and paying.num_pauses == 0 and paying.acceptance_ratio == 0.75
    assert not SpecState(enabled=False).may_draft()  # not eligible: never drafts
