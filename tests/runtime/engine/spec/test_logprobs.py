"""Requests with logprobs speculate, and each emitted token's logprobs are the target's at its
position: a greedy run gives the same tokens, the same chosen-token logprob, rank, top-k and
cumulative sum as the plain engine (the self-draft's int4 logits would differ far beyond the
tolerance), and a sampled run's entries equal the plain engine's prompt logprobs of the same
text. Every test also checks that the requests did draft and had drafts accepted, so a request
that silently stopped speculating fails it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.engine.engine import Engine
from runtime.engine.logprobs import TokenLogprob
from runtime.engine.request import GenerationRequest, TokenOutput
from runtime.engine.sampling import SamplingParams
from runtime.engine.spec.config import SpecConfig
from runtime.memory import Allocator
from runtime.models.loader import LoadedModel, load_model
from tests.runtime.engine.support import RecordingSink, engine_config, greedy, random_prompts

pytestmark = pytest.mark.usefixtures("one_torch_thread")
from tests.runtime.engine.support import one_torch_thread  # noqa: E402,F401  (the fixture)

TOL = 1e-5  # fp32 rounding: the verifying chunk and a one-token decode sum in another order
K = 4

NGRAM = SpecConfig(method="ngram", num_speculative_tokens=4, max_batch_for_speculation=64)
SELF_DRAFT = SpecConfig(method="self_draft", num_speculative_tokens=4, max_batch_for_speculation=64)


@pytest.fixture(scope="module")
def loaded(demo_model_dir: Callable[[str], Path]) -> LoadedModel:
    return load_model(demo_model_dir("llama"), device="cpu")


def _prompts(vocab: int) -> list[list[int]]:
    # quoting-style prompts (their continuation repeats them, so n-gram drafts hit) and two
    # random ones
    return [
        [5, 6, 7, 8, 9] * 6,
        [11, 12, 13] * 10,
        list(range(3, 60)) * 2,
        *random_prompts(2, 8, 30, vocab, seed=11),
    ]


def _run(
    loaded: LoadedModel, prompts: list[list[int]], params: list[SamplingParams], spec: SpecConfig
) -> tuple[list[list[TokenOutput]], RecordingSink]:
    sink = RecordingSink()
    config = engine_config(batch_warmup=False, spec=spec)
    engine = Engine(config, sink, loader=lambda: loaded, allocator=Allocator(device="cpu"))
    try:
        handles = [
            engine.submit(GenerationRequest(f"r{i}", prompt, p))
            for i, (prompt, p) in enumerate(zip(prompts, params, strict=True))
        ]
        outputs = [list(handle) for handle in handles]
        assert engine.kv_cache_stats().num_used_pages == 0
    finally:
        engine.shutdown()
    for outs in outputs:
        assert all(out.error is None for out in outs)
    return outputs, sink


def _entries(outs: list[TokenOutput]) -> list[TokenLogprob]:
    entries = [entry for out in outs for entry in (out.logprobs or [])]
    assert len(entries) == sum(len(out.token_ids) for out in outs)  # one per emitted token
    return entries


def _assert_same(got: TokenLogprob, want: TokenLogprob, k: int) -> None:
    assert got.token_id == want.token_id
    assert abs(got.logprob - want.logprob) < TOL, (got, want)
    assert got.rank == want.rank
    assert len(got.top) == len(want.top) == k
    for (got_id, got_v), (want_id, want_v) in zip(got.top, want.top, strict=True):
        assert abs(got_v - want_v) < TOL
        assert got_id == want_id or abs(got_v - want_v) < TOL  # a near-tie may swap two ids


def _assert_drafted(sink: RecordingSink, num_requests: int) -> None:
    """The first two requests (prompts whose greedy continuation repeats itself, so n-gram
    drafts hit) drafted and had drafts accepted: the checks above had teeth. (The tiny model
    has random weights: it quotes nothing, its outputs repeat their own n-grams.)"""
    records = {r.request_id: r for r in sink.finished}
    assert len(records) == num_requests
    counts = {r.request_id: (r.spec_draft_tokens, r.spec_accepted_tokens) for r in sink.finished}
    assert all(counts[rid][1] > 0 for rid in ("r0", "r1")), counts


@pytest.mark.parametrize("spec", [NGRAM, SELF_DRAFT], ids=["ngram", "self_draft"])
def test_greedy_logprobs_equal_the_plain_engine(loaded: LoadedModel, spec: SpecConfig) -> None:
    prompts = _prompts(loaded.args.vocab_size)
    params = [greedy(24, logprobs=K, cumulative_logprob=True) for _ in prompts]
    params[0] = greedy(24, logprobs=K, prompt_logprobs=2, cumulative_logprob=True)  # echo too
    params[1] = greedy(24, logprobs=0)  # the chosen token's own only
    plain, _ = _run(loaded, prompts, params, SpecConfig())
    drafted, sink = _run(loaded, prompts, params, spec)
    for p, want_outs, got_outs in zip(params, plain, drafted, strict=True):
        assert [t for o in got_outs for t in o.token_ids] == [
            t for o in want_outs for t in o.token_ids
        ]
        k = p.logprobs or 0
        for got, want in zip(_entries(got_outs), _entries(want_outs), strict=True):
            _assert_same(got, want, k)
        if p.cumulative_logprob:  # the running sum, output by output
            sums = [
                (g.cumulative_logprob, w.cumulative_logprob)
                for g, w in zip(got_outs, want_outs, strict=True)
            ]
            assert all(g is not None and w is not None and abs(g - w) < 1e-4 for g, w in sums)
        if p.prompt_logprobs is not None:  # sent once, with the first token, in both runs
            got_prompt, want_prompt = got_outs[0].prompt_logprobs, want_outs[0].prompt_logprobs
            assert got_prompt is not None and want_prompt is not None
            assert got_prompt[0] is None and want_prompt[0] is None
            for g, w in zip(got_prompt[1:], want_prompt[1:], strict=True):
                assert g is not None and w is not None
                _assert_same(g, w, p.prompt_logprobs)
    _assert_drafted(sink, len(prompts))


def test_sampled_logprobs_are_the_targets_at_each_position(loaded: LoadedModel) -> None:
    """Sampled tokens differ from a plain run's (other draws); each entry must still equal the
    target's logprobs of that token after that text: the plain engine's prompt logprobs of
    prompt + output."""
    prompts = _prompts(loaded.args.vocab_size)[:2]
    # a low temperature: the random-weight model's near-flat distribution sharpens enough for
    # its outputs to repeat (and the n-gram drafts to hit) while tokens are still drawn
    params = [SamplingParams(max_tokens=24, temperature=0.02, seed=i, logprobs=K) for i in (3, 4)]
    drafted, sink = _run(loaded, prompts, params, NGRAM)
    accepted = {r.request_id: r.spec_accepted_tokens for r in sink.finished}
    assert accepted["r1"] > 0, accepted  # its sampled continuation repeats: drafts were taken
    texts = [
        prompt + [t for o in outs for t in o.token_ids]
        for prompt, outs in zip(prompts, drafted, strict=True)
    ]
    echo = [SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=K) for _ in texts]
    scored, _ = _run(loaded, texts, echo, SpecConfig())
    for prompt, outs, score in zip(prompts, drafted, scored, strict=True):
        reference = score[0].prompt_logprobs
        assert reference is not None
        for j, entry in enumerate(_entries(outs)):
            want = reference[len(prompt) + j]
            assert want is not None
            _assert_same(entry, want, K)


def _by_choice(outs: list[TokenOutput]) -> dict[int, list[TokenOutput]]:
    """A request's outputs per choice (n > 1: the choices interleave, TokenOutput.index)."""
    choices: dict[int, list[TokenOutput]] = {}
    for out in outs:
        choices.setdefault(out.index, []).append(out)
    return choices


@pytest.mark.parametrize("spec", [NGRAM, SELF_DRAFT], ids=["ngram", "self_draft"])
def test_n_choices_logprobs_are_each_choices_own(loaded: LoadedModel, spec: SpecConfig) -> None:
    """n > 1: every choice speculates on its own row and gets its own tokens' logprobs. Greedy
    choices equal the plain engine's entry for entry; sampled ones (other draws than a plain
    run's) equal the target's logprobs of their own text (the plain engine's prompt logprobs)."""
    prompts = _prompts(loaded.args.vocab_size)[:3]
    greedy_n = greedy(24, logprobs=K, n=2)
    plain, _ = _run(loaded, prompts, [greedy_n] * 3, SpecConfig())
    drafted, sink = _run(loaded, prompts, [greedy_n] * 3, spec)
    for want_outs, got_outs in zip(plain, drafted, strict=True):
        want, got = _by_choice(want_outs), _by_choice(got_outs)
        assert sorted(got) == sorted(want) == [0, 1]
        for index in want:
            assert [t for o in got[index] for t in o.token_ids] == [
                t for o in want[index] for t in o.token_ids
            ]
            for g, w in zip(_entries(got[index]), _entries(want[index]), strict=True):
                _assert_same(g, w, K)
    _assert_drafted(sink, len(prompts))
    sampled = [SamplingParams(max_tokens=24, temperature=0.02, seed=7, n=3, logprobs=K)]
    drafted, sink = _run(loaded, prompts[1:2], sampled, spec)
    assert sum(s.num_accepted_tokens for s in sink.steps) > 0
    choices = _by_choice(drafted[0])
    assert sorted(choices) == [0, 1, 2]
    texts = [prompts[1] + [t for o in choices[i] for t in o.token_ids] for i in range(3)]
    echo = [SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=K) for _ in texts]
    scored, _ = _run(loaded, texts, echo, SpecConfig())
    for index, score in enumerate(scored):
        reference = score[0].prompt_logprobs
        assert reference is not None
        for j, entry in enumerate(_entries(choices[index])):
            expected = reference[len(prompts[1]) + j]
            assert expected is not None
            _assert_same(entry, expected, K)
