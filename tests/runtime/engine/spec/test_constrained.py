"""Constrained requests (structured output) speculate: each draft is judged under the grammar, so
greedy outputs are token for token the plain engine's (with logprobs, equal too), sampled ones
still parse, drafts the grammar forbids are rejected, and the requests really drafted and had
drafts accepted (a request that silently stopped speculating fails these tests)."""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
import xgrammar as xgr
from scipy.stats import chisquare

from runtime.engine.constraints import ConstraintSpec
from runtime.engine.constraints.cache import Compiled
from runtime.engine.constraints.state import ConstraintState
from runtime.engine.engine import Engine
from runtime.engine.request import GenerationRequest, TokenOutput
from runtime.engine.sampling import SamplingParams
from runtime.engine.spec.config import SpecConfig
from runtime.engine.spec.constrained import verify_constrained
from runtime.memory import Allocator
from runtime.models.loader import LoadedModel, load_model
from tests.runtime.engine.support import RecordingSink, engine_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")
from tests.runtime.engine.support import one_torch_thread  # noqa: E402,F401  (the fixture)

NGRAM = SpecConfig(method="ngram", num_speculative_tokens=4, max_batch_for_speculation=64)
# grammars whose outputs repeat themselves (so n-gram drafts can hit) and one free-form one
REGEXES = [r"(one two ){3,4}", r"(ab-){4,6}\d", r"[a-c]{2,4}-\d{1,3}"]


@pytest.fixture(scope="module")
def loaded(demo_model_dir: Callable[[str], Path]) -> LoadedModel:
    return load_model(demo_model_dir("llama"), device="cpu")


def _requests(
    loaded: LoadedModel, params: list[SamplingParams], copies: int = 1
) -> list[GenerationRequest]:
    tokenizer = loaded.tokenizer
    assert tokenizer is not None
    prompt = tokenizer.encode("one two three one two three ab-ab-ab-ab- one two three ab-ab-")
    return [
        GenerationRequest(  # a token of its own first: no request shares another's pages
            f"r{i}", [40 + i, *prompt], p, constraint=ConstraintSpec("regex", regex, "guided_regex")
        )
        for i, (regex, p) in enumerate(zip(REGEXES * copies, params * copies, strict=True))
    ]


def _run(
    loaded: LoadedModel, requests: list[GenerationRequest], spec: SpecConfig, **overrides: object
) -> tuple[list[list[TokenOutput]], RecordingSink]:
    sink = RecordingSink()
    config = engine_config(batch_warmup=False, spec=spec, **overrides)
    engine = Engine(config, sink, loader=lambda: loaded, allocator=Allocator(device="cpu"))
    try:
        handles = [engine.submit(r) for r in requests]  # all at once: they batch together
        outputs = [list(handle) for handle in handles]
        assert engine.kv_cache_stats().num_used_pages == 0
    finally:
        engine.shutdown()
    for outs, request in zip(outputs, requests, strict=True):
        assert all(out.error is None for out in outs)
        assert outs[-1].finished_reason == "stop"
        assert request.constraint is not None
        assert re.fullmatch(request.constraint.source, "".join(out.text for out in outs))
    return outputs, sink


def _drafted(sink: RecordingSink) -> tuple[int, int]:
    records = [r for r in sink.finished if r.request_id in ("r0", "r1")]
    assert len(records) == 2
    return sum(r.spec_draft_tokens for r in records), sum(r.spec_accepted_tokens for r in records)


def test_greedy_constrained_equals_the_plain_engine(loaded: LoadedModel) -> None:
    params = [SamplingParams(max_tokens=48, temperature=0.0, logprobs=2) for _ in REGEXES]
    plain, _ = _run(loaded, _requests(loaded, params), SpecConfig())
    drafted, sink = _run(loaded, _requests(loaded, params), NGRAM)
    for got, want in zip(drafted, plain, strict=True):
        assert [t for o in got for t in o.token_ids] == [t for o in want for t in o.token_ids]
        got_lp = [e for o in got for e in (o.logprobs or [])]
        want_lp = [e for o in want for e in (o.logprobs or [])]
        assert len(got_lp) == len(want_lp) == sum(len(o.token_ids) for o in got)
        for g, w in zip(got_lp, want_lp, strict=True):  # unmasked: the model's own values
            assert g.token_id == w.token_id and g.rank == w.rank
            assert abs(g.logprob - w.logprob) < 1e-5
    num_drafted, num_accepted = _drafted(sink)
    assert num_drafted > 0 and num_accepted > 0


def test_sampled_constrained_outputs_parse(loaded: LoadedModel) -> None:
    params = [SamplingParams(max_tokens=96, temperature=1.0, seed=i) for i in range(3)]
    for _ in range(2):  # two seeds' worth of draws; each output is checked against its regex
        _, sink = _run(loaded, _requests(loaded, params), NGRAM)
        num_drafted, num_accepted = _drafted(sink)
        assert num_drafted > 0 and num_accepted > 0
        params = [SamplingParams(max_tokens=96, temperature=1.0, seed=10 + i) for i in range(3)]


def test_preempted_constrained_rows_equal_the_plain_engine(loaded: LoadedModel) -> None:
    """A KV pool far smaller than the batch wants: constrained rows are preempted (their KV
    freed, recomputed on resume) between verified chunks; the matcher follows the emitted
    tokens only, so the outputs are still the plain engine's (which runs with a full pool).
    n-gram only: the self-draft drafts without the grammar's mask, and on this random-weight
    model none of its 160 drafts on these requests was the masked argmax: a vacuous test."""
    params = [SamplingParams(max_tokens=48, temperature=0.0) for _ in REGEXES]
    args = loaded.args
    page_bytes = 16 * 2 * args.num_layers * args.num_kv_heads * args.head_dim * 4
    plain, _ = _run(loaded, _requests(loaded, params, copies=4), SpecConfig())
    requests = _requests(loaded, params, copies=4)
    drafted, sink = _run(loaded, requests, NGRAM, kv_cache_bytes=8 * page_bytes)
    for got, want in zip(drafted, plain, strict=True):
        assert [t for o in got for t in o.token_ids] == [t for o in want for t in o.token_ids]
    assert sink.steps[-1].kv is not None and sink.steps[-1].kv.num_preemptions > 0
    num_drafted, num_accepted = _drafted(sink)
    assert num_drafted > 0 and num_accepted > 0


# --- the verifier alone, on a six-token vocabulary: "a" .. "e" and a stop token -----------------
VOCAB = ["a", "b", "c", "d", "e", "</s>"]
A, B, C, D, E = range(5)


def _state(regex: str) -> ConstraintState:
    info = xgr.TokenizerInfo(VOCAB, stop_token_ids=[len(VOCAB) - 1])
    grammar = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False).compile_regex(regex)
    future: Future[Compiled] = Future()
    future.set_result(Compiled(grammar, compile_seconds=0.0, size_bytes=0))
    return ConstraintState(ConstraintSpec("regex", regex, "guided_regex"), future, True)


def _masked_probs(logits: torch.Tensor, allowed: list[int], temperature: float) -> torch.Tensor:
    keep = torch.full_like(logits, float("-inf"))
    keep[allowed] = 0.0
    return ((logits + keep) / temperature).softmax(dim=-1)


def test_greedy_rejects_a_draft_the_grammar_forbids() -> None:
    state = _state("[abc][bd]e")
    logits = torch.zeros(3, len(VOCAB))
    logits[0, E], logits[0, C] = 9.0, 5.0  # "e" is the model's favourite, and forbidden first
    logits[1, D] = 5.0
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    out = verify_constrained(logits, [E, D], greedy, None, state, num_outputs=0)
    assert (out.token_ids, out.num_accepted) == ([C], 0)
    assert state.num_accepted == 1 and state.num_rejected == 0  # saw only the emitted token
    state.sync(0)
    out = verify_constrained(logits, [C, D], greedy, None, state, num_outputs=0)
    assert (out.token_ids, out.num_accepted) == ([C, D, E], 2)  # "e": the grammar's one token
    assert state.num_accepted == 3


@pytest.mark.parametrize("first_draft", [B, E], ids=["allowed", "forbidden"])
def test_sampled_keeps_the_masked_target_distribution(first_draft: int) -> None:
    """The first emitted token follows the target's masked p_1 whatever the draft (a forbidden
    draft is never emitted), the second, given the first draft was accepted, the masked p_2."""
    state = _state("[abc][bd]e")
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, len(VOCAB), generator=g)
    params = SamplingParams(max_tokens=8, temperature=1.2)
    gen = torch.Generator().manual_seed(9)
    firsts: list[int] = []
    seconds: list[int] = []
    for _ in range(NUM_DRAWS):
        state.sync(0)  # every draw verifies from the start of the output
        out = verify_constrained(logits, [first_draft, D], params, gen, state, num_outputs=0)
        firsts.append(out.token_ids[0])
        if out.token_ids[0] == first_draft:
            seconds.append(out.token_ids[1])
    assert state.num_rejected == 0
    _chi2(firsts, _masked_probs(logits[0], [A, B, C], 1.2))
    if first_draft == B:
        assert len(seconds) > 500
        _chi2(seconds, _masked_probs(logits[1], [B, D], 1.2))
    else:
        assert not seconds  # a forbidden draft is never emitted


NUM_DRAWS = 10_000


def _chi2(tokens: list[int], probs: torch.Tensor) -> None:
    observed = [tokens.count(t) for t in range(len(VOCAB))]
    support = [t for t in range(len(VOCAB)) if probs[t] > 0]
    assert all(observed[t] == 0 for t in range(len(VOCAB)) if probs[t] == 0)
    expected = [float(probs[t]) * len(tokens) for t in support]
    scale = len(tokens) / sum(expected)
    result = chisquare([observed[t] for t in support], [e * scale for e in expected])
    assert result.pvalue > 1e-4, (observed, expected)
