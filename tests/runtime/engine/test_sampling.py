"""Sampler: greedy, seeds, top-k / top-p masks (hand-computed and vs transformers' warpers)."""

from __future__ import annotations

import math

import pytest
import torch

from runtime.engine.sampling import SamplingParams, apply_top_k_top_p, make_generator, sample
from runtime.errors import InvalidRequestError


def _kept(masked: torch.Tensor) -> list[list[int]]:
    return [torch.nonzero(torch.isfinite(row)).flatten().tolist() for row in masked]


def test_greedy_is_argmax() -> None:
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0.0)] * 6
    assert torch.equal(sample(logits, params, [None] * 6), logits.argmax(-1))


def test_mixed_batch_greedy_rows_stay_argmax() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(temperature=t) for t in (0.0, 1.0, 0.0, 2.0)]
    out = sample(logits, params, [None] * 4)
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()


def test_seed_reproducible_and_independent_of_batch() -> None:
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(3))
    params = [SamplingParams(temperature=1.0, seed=7)] * 3

    def draws(rows: list[int]) -> list[list[int]]:
        gens = [make_generator(7, "cpu") for _ in rows]
        return [sample(logits[rows], params[: len(rows)], gens).tolist() for _ in range(20)]

    alone = draws([1])
    together = draws([0, 1, 2])
    assert [d[0] for d in alone] == [d[1] for d in together]
    assert draws([0, 1, 2]) == together
    other = [make_generator(8, "cpu")]
    assert [sample(logits[[1]], params[:1], other).item() for _ in range(20)] != [
        d[0] for d in alone
    ]


def test_top_k_mask_by_hand() -> None:
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0], [1.0, 4.0, 3.0, 2.0]])
    masked = apply_top_k_top_p(logits, torch.tensor([2, 0]), torch.tensor([1.0, 1.0]))
    assert _kept(masked) == [[1, 2], [0, 1, 2, 3]]
    assert masked[0, 1] == 4.0 and masked[0, 2] == 3.0  # kept logits unchanged


@pytest.mark.parametrize(
    ("top_p", "kept"), [(0.4, [0]), (0.75, [0, 1]), (0.85, [0, 1, 2]), (1.0, [0, 1, 2, 3])]
)
def test_top_p_mask_by_hand(top_p: float, kept: list[int]) -> None:
    # probabilities 0.5, 0.3, 0.15, 0.05: p keeps the most likely tokens until their mass reaches p
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    masked = apply_top_k_top_p(logits, torch.tensor([0]), torch.tensor([top_p]))
    assert _kept(masked) == [kept]


def test_top_p_after_top_k_renormalises() -> None:
    # after top-k=2 the survivors have mass 0.625 / 0.375, so p=0.6 keeps only the first
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    masked = apply_top_k_top_p(logits, torch.tensor([2]), torch.tensor([0.6]))
    assert _kept(masked) == [[0]]


def test_masks_match_transformers_warpers() -> None:
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(8, 200, generator=gen) * 3
    for top_k, top_p in [(5, 1.0), (0, 0.9), (40, 0.5), (1, 0.3), (0, 0.99)]:
        ours = apply_top_k_top_p(logits, torch.tensor([top_k] * 8), torch.tensor([top_p] * 8))
        ref = logits.clone()
        if top_k:
            ref = TopKLogitsWarper(top_k)(None, ref)
        if top_p < 1.0:
            ref = TopPLogitsWarper(top_p)(None, ref)
        assert _kept(ours) == _kept(ref), (top_k, top_p)


def test_draws_follow_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(4000, 4).contiguous()
    params = [SamplingParams(temperature=1.0)] * 4000
    torch.manual_seed(0)
    counts = torch.bincount(sample(logits, params, [None] * 4000), minlength=4) / 4000
    assert torch.allclose(counts, probs, atol=0.03)
    # temperature 0.5 squares and renormalises the probabilities
    params = [SamplingParams(temperature=0.5)] * 4000
    counts = torch.bincount(sample(logits, params, [None] * 4000), minlength=4) / 4000
    sharp = probs**2 / (probs**2).sum()
    assert torch.allclose(counts, sharp, atol=0.03)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", 1.5),
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("top_k", -1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("seed", "x"),
        ("stop", ("",)),
        ("stop", tuple(str(i) for i in range(17))),
        ("stop_token_ids", (-1,)),
    ],
)
def test_construction_validates_and_names_the_param(field: str, value: object) -> None:
    with pytest.raises(InvalidRequestError) as exc:
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    assert exc.value.param == field


def test_valid_params_pass() -> None:
    SamplingParams(
        max_tokens=5, temperature=0.7, top_k=20, top_p=0.9, seed=-3, stop=("\n",)
    ).validate()
