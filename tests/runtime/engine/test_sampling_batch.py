"""The step's sampling batch (runtime.engine.sampling): a plain batch builds nothing and reads no
row; a mixed batch builds exactly the processors its rows need, each owning its rows; the sampler
gives what the old per-row path gave (bench.sampling_step keeps that path as the reference), with
logprobs equal to torch's log_softmax of the model's own logits."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import xgrammar as xgr

from bench.sampling_step import check_same, synthetic_vocab
from runtime.engine.choice_group import ChoiceGroup, ChoiceState
from runtime.engine.constraints import ConstraintSpec, ConstraintState, GrammarCache
from runtime.engine.constraints.mask import GrammarMask
from runtime.engine.features import features_for
from runtime.engine.sampling import SamplingParams
from runtime.engine.sampling.batch import SamplingBatch
from runtime.engine.sampling.processors import LogitBias, MinTokens, Penalties
from runtime.engine.sampling.sampler import Sampler
from runtime.engine.sequence import Sequence

VOCAB = 512


class Untouchable:
    """A row that fails the test if the batch reads anything of it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a plain batch read .{name} of a row")


def row(params: SamplingParams, *, constraint: Any = None, verified: bool = False) -> Any:
    return SimpleNamespace(
        request=SimpleNamespace(sampling=params),
        prompt_token_ids=[1, 2, 3, 3],
        output_token_ids=[3, 4, 4],
        stop_checker=SimpleNamespace(stop_token_ids=frozenset({0, 9})),
        features=features_for(params, 0, "cpu", constraint=constraint, verified=verified),
    )


@pytest.fixture(scope="module")
def grammars() -> Iterator[GrammarCache]:
    cache = GrammarCache(xgr.TokenizerInfo(synthetic_vocab(VOCAB), stop_token_ids=[0]))
    yield cache
    cache.close()


def constraint(grammars: GrammarCache) -> ConstraintState:
    spec = ConstraintSpec.choice(["yes", "no"], "guided_choice")
    future, hit = grammars.get(spec)
    future.result(timeout=60)
    state = ConstraintState(spec, future, hit)
    state.bind()
    return state


def logits(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_a_plain_greedy_batch_builds_nothing_and_reads_no_row() -> None:
    rows = [Untouchable() for _ in range(32)]
    batch = SamplingBatch.build(rows, featured=False, all_greedy=True, device="cpu")
    assert batch.temperatures is None and batch.top_k is None and batch.top_p is None
    assert batch.processors == [] and batch.grammar is None
    assert batch.logprob_rows is None and batch.verified is None and batch.fork_rows is None
    assert batch.is_greedy_only
    x = logits(32)
    out = Sampler()(x.clone(), batch)
    assert out.token_ids == x.argmax(dim=-1).tolist() and out.logprobs is None


def test_plain_requests_have_no_features_slot() -> None:
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_p=0.9)):
        assert features_for(params, 0, "cpu", constraint=None, verified=False) is None
    for asked in (
        SamplingParams(logprobs=0),
        SamplingParams(prompt_logprobs=1),
        SamplingParams(seed=3),
        SamplingParams(n=2),
        SamplingParams(min_tokens=1),
        SamplingParams(logit_bias=((5, 1.0),)),
    ):
        assert features_for(asked, 0, "cpu", constraint=None, verified=False) is not None
    verified = features_for(SamplingParams(), 0, "cpu", constraint=None, verified=True)
    assert verified is not None and verified.verify is not None


def test_a_plain_sampled_batch_builds_only_the_sampling_tensors() -> None:
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.5)]
    batch = SamplingBatch.build(
        [row(p) for p in params], featured=False, all_greedy=False, device="cpu"
    )
    assert batch.temperatures is not None and batch.temperatures.tolist() == [1.0, 0.5]
    assert batch.greedy_rows is not None and batch.greedy_rows.tolist() == [True, False]
    assert batch.top_k is None and batch.processors == [] and batch.logprob_rows is None


def test_a_mixed_batch_builds_exactly_the_processors_needed(grammars: GrammarCache) -> None:
    rows = [
        row(SamplingParams(temperature=0.0)),  # 0: plain
        row(SamplingParams(temperature=0.0, logprobs=2)),  # 1
        row(SamplingParams(temperature=0.0, presence_penalty=0.5)),  # 2
        row(SamplingParams(temperature=0.0, logit_bias=((5, 2.0),), min_tokens=6)),  # 3
        row(SamplingParams(temperature=0.0), constraint=constraint(grammars)),  # 4
    ]
    batch = SamplingBatch.build(rows, featured=True, all_greedy=True, device="cpu")
    assert batch.temperatures is None  # every row greedy
    assert [type(p) for p in batch.processors] == [Penalties, LogitBias, MinTokens, GrammarMask]
    assert [p.rows for p in batch.processors] == [[2], [3], [3], [4]]
    assert batch.logprob_rows == [1] and batch.logprob_ks == [2]
    only_logprobs = SamplingBatch.build(rows[:2], featured=True, all_greedy=True, device="cpu")
    assert only_logprobs.processors == [] and only_logprobs.logprob_rows == [1]
    only_penalty = SamplingBatch.build(
        [rows[0], rows[2]], featured=True, all_greedy=True, device="cpu"
    )
    assert [type(p) for p in only_penalty.processors] == [Penalties]
    assert only_penalty.logprob_rows is None


def test_forks_sample_from_their_first_choice_row() -> None:
    params = SamplingParams(temperature=0.0, n=3)
    first, *children = [row(params) for _ in range(3)]
    group: ChoiceGroup[Any] = ChoiceGroup(members=[first, *children], num_open=3)
    first.features.choice = ChoiceState(0, group, pending_forks=children)
    other = row(SamplingParams(temperature=0.0))
    batch = SamplingBatch.build([other, first], featured=True, all_greedy=True, device="cpu")
    assert batch.rows == [other, first, *children] and batch.num_own == 2
    assert batch.fork_rows is not None and batch.fork_rows.tolist() == [0, 1, 1, 1]
    x = logits(2)
    out = Sampler()(x.clone(), batch)
    top = x.argmax(dim=-1).tolist()
    assert out.token_ids == [top[0], top[1], top[1], top[1]]


def test_logprobs_are_the_models_own_and_verified_logits_precede_the_processors() -> None:
    params = [
        SamplingParams(temperature=0.9, logprobs=3, presence_penalty=1.5, seed=11),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, logit_bias=((7, -50.0),)),
    ]
    rows = [row(params[0]), row(params[1]), row(params[2], verified=True)]
    batch = SamplingBatch.build(rows, featured=True, all_greedy=False, device="cpu")
    x = logits(3, seed=4)
    out = Sampler()(x.clone(), batch)
    assert out.logprobs is not None and out.logprobs[1] is None and out.logprobs[2] is None
    entry = out.logprobs[0]
    assert entry is not None and entry.token_id == out.token_ids[0]
    want = torch.log_softmax(x[0].double(), dim=-1)  # before temperature and the penalty
    assert entry.logprob == pytest.approx(float(want[entry.token_id]), abs=1e-5)
    assert [t for t, _ in entry.top] == want.topk(3).indices.tolist()
    state = rows[2].features.verify
    assert state.chosen_logit == pytest.approx(float(x[2, out.token_ids[2]]))
    # a seeded row's token depends on its seed only, not on the batch around it
    alone = SamplingBatch.build([row(params[0])], featured=True, all_greedy=False, device="cpu")
    assert Sampler()(x[:1].clone(), alone).token_ids == out.token_ids[:1]


@pytest.mark.parametrize("kind", ["plain", "mixed"])
def test_the_sampler_gives_what_the_old_path_gave(kind: str, grammars: GrammarCache) -> None:
    """Same logits, same seeds (request seeds and the global RNG): the same tokens and the same
    logprob sums as the old per-row path (bench.sampling_step_old.old_step)."""
    assert check_same(kind, VOCAB, grammars)


def test_sequence_keeps_what_every_sequence_needs_and_one_features_slot() -> None:
    names = {f.name for f in dataclasses.fields(Sequence)}
    assert len(names) <= 17 and "features" in names
    assert not names & {"step_logprob", "chosen_logit", "fork_token", "constraint", "generator"}
