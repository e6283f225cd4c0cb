"""Requests with logits controls (penalties, logit_bias, min_tokens) speculate: each drafted
position gets the controls as if the drafts before it had been emitted, so greedy outputs are
token for token the plain engine's with the same controls. Each case checks that drafts were
made and accepted (a row that silently stopped speculating would pass vacuously otherwise) and
that the controls changed the output (a case they do not touch would not test them). Sampled
rows keep the controlled distribution (chi-square over 10k draws of the first two tokens)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest
import torch
from scipy.stats import chisquare

from runtime.engine.engine import Engine
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.engine.spec.config import SpecConfig
from runtime.engine.spec.controls import controlled_logits
from runtime.engine.spec.verify import verify_row
from runtime.memory import Allocator
from runtime.models.loader import LoadedModel, load_model
from tests.runtime.engine.support import RecordingSink, engine_config, greedy

if TYPE_CHECKING:
    from runtime.engine.sampling.rows import Row

pytestmark = pytest.mark.usefixtures("one_torch_thread")
from tests.runtime.engine.support import one_torch_thread  # noqa: E402,F401  (the fixture)

NGRAM = SpecConfig(method="ngram", num_speculative_tokens=4, max_batch_for_speculation=64)
SELF_DRAFT = SpecConfig(method="self_draft", num_speculative_tokens=4, max_batch_for_speculation=64)
STOP = 40  # the stop token of the min_tokens case (the prompt repeats it)

# repetitive prompts: their continuations repeat them, so n-gram drafts hit
PROMPTS = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 10, [STOP] * 20, list(range(3, 60)) * 2]


@pytest.fixture(scope="module")
def loaded(demo_model_dir: Callable[[str], Path]) -> LoadedModel:
    return load_model(demo_model_dir("llama"), device="cpu")


def _run(
    loaded: LoadedModel, params: SamplingParams, spec: SpecConfig, sink: RecordingSink | None
) -> list[list[int]]:
    config = engine_config(batch_warmup=False, spec=spec)
    engine = Engine(config, sink, loader=lambda: loaded, allocator=Allocator(device="cpu"))
    try:
        handles = [
            engine.submit(GenerationRequest(f"r{i}", prompt, params))
            for i, prompt in enumerate(PROMPTS)
        ]
        ids = [handle.result().token_ids for handle in handles]
        assert engine.kv_cache_stats().num_used_pages == 0  # drafted pages back too
    finally:
        engine.shutdown()
    return ids


# small penalties: this tiny model's logits are nearly flat, so larger ones forbid every repeat
# and no draft would ever be accepted (the frequency case stops a run of 483 after three)
CONTROLS: dict[str, dict[str, Any]] = {
    "frequency": {"frequency_penalty": 0.02},
    "presence": {"presence_penalty": 0.05},
    "repetition": {"repetition_penalty": 1.05},
    "bias": {"logit_bias": ((6, 3.0), (12, -4.0), (30, 2.5))},
    "min_tokens": {"min_tokens": 12, "stop_token_ids": (STOP,), "logit_bias": ((STOP, 6.0),)},
    "all": {
        "frequency_penalty": 0.02,
        "presence_penalty": 0.02,
        "repetition_penalty": 1.02,
        "logit_bias": ((7, 2.0),),
        "min_tokens": 6,
    },
}


@pytest.mark.parametrize("spec", [NGRAM, SELF_DRAFT], ids=["ngram", "self_draft"])
@pytest.mark.parametrize("control", sorted(CONTROLS))
def test_greedy_with_controls_is_the_plain_output(
    loaded: LoadedModel, spec: SpecConfig, control: str
) -> None:
    params = greedy(24, **CONTROLS[control])
    plain = _run(loaded, params, SpecConfig(), None)
    sink = RecordingSink()
    drafted = _run(loaded, params, spec, sink)
    assert drafted == plain
    assert plain != _run(loaded, greedy(24), SpecConfig(), None)  # the controls changed it
    assert sum(s.num_draft_tokens for s in sink.steps) > 0
    assert sum(s.num_accepted_tokens for s in sink.steps) > 0
    if control == "min_tokens":  # the stop token is held off until min_tokens, then stops
        assert all(len(ids) > 12 and STOP not in ids[:12] for ids in plain)
        assert any(ids[-1] == STOP for ids in plain)


VOCAB = 8
NUM_DRAWS = 10_000


def _expected(logits: torch.Tensor, outputs: list[int], params: SamplingParams) -> torch.Tensor:
    """The controlled distribution computed here by hand (OpenAI's formulas): frequency and
    presence on the output counts, the bias, the stop token masked under min_tokens."""
    counts = torch.bincount(torch.tensor(outputs, dtype=torch.long), minlength=VOCAB).float()
    x = logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0)
    for token, bias in params.logit_bias:
        x[token] += bias
    if len(outputs) < params.min_tokens:
        x[STOP_SMALL] = float("-inf")
    return (x / params.temperature).softmax(dim=-1)


STOP_SMALL = 7


@pytest.mark.parametrize("first_draft", [2, 5])
def test_sampled_keeps_the_controlled_distribution(first_draft: int) -> None:
    """The first emitted token follows the controlled p_1; the second, given the first draft was
    accepted, the p_2 controlled as if that draft had been emitted (its count penalized, and
    the stop token, masked at position 1 by min_tokens, allowed at position 2)."""
    params = SamplingParams(
        max_tokens=8,
        temperature=1.1,
        frequency_penalty=1.5,
        presence_penalty=0.5,
        logit_bias=((3, 1.0),),
        min_tokens=2,
        stop_token_ids=(STOP_SMALL,),
        ignore_eos=True,
    )
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, VOCAB, generator=g)
    logits[0, first_draft] += 4.5  # often accepted (2 is an output already: penalized)
    logits[1, first_draft] += 2.0  # and likely again: its own penalty matters at position 2
    logits[1, STOP_SMALL] += 1.0
    row = SimpleNamespace(
        request=SimpleNamespace(sampling=params),
        prompt_token_ids=[1, 2, 3],
        output_token_ids=[4, 2],
        stop_checker=SimpleNamespace(stop_token_ids=frozenset({STOP_SMALL})),
        features=None,
    )
    drafts = [first_draft, 6]
    judged = controlled_logits(logits, cast("Row", row), drafts)
    gen = torch.Generator().manual_seed(9)
    firsts: list[int] = []
    seconds: list[int] = []
    for _ in range(NUM_DRAWS):
        out = verify_row(judged, drafts, params, gen)
        firsts.append(out.token_ids[0])
        if out.token_ids[0] == first_draft:
            seconds.append(out.token_ids[1])
    _chi2(firsts, _expected(logits[0], [4, 2], params))
    assert len(seconds) > 500
    _chi2(seconds, _expected(logits[1], [4, 2, first_draft], params))


def _chi2(tokens: list[int], probs: torch.Tensor) -> None:
    observed = [tokens.count(t) for t in range(VOCAB)]
    support = [t for t in range(VOCAB) if probs[t] > 0]
    assert all(observed[t] == 0 for t in range(VOCAB) if probs[t] == 0)
    expected = [float(probs[t]) * len(tokens) for t in support]
    scale = len(tokens) / sum(expected)
    result = chisquare([observed[t] for t in support], [e * scale for e in expected])
    assert result.pvalue > 1e-4, (observed, expected)
