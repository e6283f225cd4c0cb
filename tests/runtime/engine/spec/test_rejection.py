"""Rejection sampling keeps the target's distribution exactly: over many draws of one
verification, the first emitted token follows the target's p_1 (after temperature and top-k /
top-p) whatever the draft, and the second one, given the first draft was accepted, follows p_2.
Checked with scipy's chi-square test against softmax probabilities computed here from torch's own
softmax (not the code under test's)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from runtime.engine.sampling import SamplingParams
from runtime.engine.spec.verify import verify_row

VOCAB = 6
NUM_DRAWS = 10_000


def _expected(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    scaled = logits / temperature
    if top_k:
        kth = scaled.topk(top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return scaled.softmax(dim=-1)


def _counts(tokens: list[int]) -> list[int]:
    return [tokens.count(t) for t in range(VOCAB)]


def _check(observed: list[int], probs: torch.Tensor) -> None:
    total = sum(observed)
    support = [t for t in range(VOCAB) if probs[t] > 0]
    assert all(observed[t] == 0 for t in range(VOCAB) if probs[t] == 0)
    expected = [float(probs[t]) * total for t in support]
    scale = total / sum(expected)
    result = chisquare([observed[t] for t in support], [e * scale for e in expected])
    assert result.pvalue > 1e-4, (observed, expected)


@pytest.mark.parametrize(
    ("temperature", "top_k", "rank"),
    [(1.0, 0, 1), (1.3, 4, 0)],  # rank: the first draft is the target's rank-th likeliest token
)
def test_first_two_tokens_keep_the_target_distribution(
    temperature: float, top_k: int, rank: int
) -> None:
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(3, VOCAB, generator=g) * 1.5  # positions of d1, d2 and after
    drafts = [int(logits[0].argsort(descending=True)[rank]), 3]
    params = SamplingParams(max_tokens=8, temperature=temperature, top_k=top_k)
    gen = torch.Generator().manual_seed(11)
    firsts: list[int] = []
    seconds: list[int] = []
    for _ in range(NUM_DRAWS):
        out = verify_row(logits, drafts, params, gen).token_ids
        firsts.append(out[0])
        if out[0] == drafts[0]:  # accepted: the next token is drawn at position 2
            seconds.append(out[1])
    _check(_counts(firsts), _expected(logits[0], temperature, top_k))
    assert len(seconds) > 500  # enough accepted first drafts to test the second position
    _check(_counts(seconds), _expected(logits[1], temperature, top_k))


def test_greedy_accepts_the_longest_agreeing_prefix_plus_the_target_token() -> None:
    logits = torch.full((4, VOCAB), -5.0)
    for position, token in enumerate([3, 1, 4, 2]):
        logits[position, token] = 5.0
    params = SamplingParams(max_tokens=8, temperature=0.0)
    assert verify_row(logits, [3, 1, 0], params, None).token_ids == [3, 1, 4]
    assert verify_row(logits, [3, 1, 4], params, None).token_ids == [3, 1, 4, 2]  # + bonus
    assert verify_row(logits, [0, 1, 4], params, None).token_ids == [3]
