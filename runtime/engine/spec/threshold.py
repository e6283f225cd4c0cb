"""The batch above which a step runs without drafts, read off the warm-up's step times.

A drafting row turns a one-token decode into a 1 + k token chunk. At batch b the step then scores
b(k + 1) tokens where a plain step scores b, and emits b·E tokens where the plain one emits b. On
a device whose step time is flat in the token count (weights read once, per-op overhead) the
extra tokens are nearly free and speculation pays; once the step is bound by arithmetic they cost
their full share and it loses. The warm-up sweep (runtime.engine.batching.warmup) already timed
plain steps of 1, 2, 4, … 64 rows of one token each, so T(n tokens) is known without new steps.

The model (one step, b rows, k drafts each, acceptance a per drafted token):
- E = 1 + a + a² + … + a^k: tokens a drafting row emits per step (the accepted prefix, then the
  target's own token), the usual geometric acceptance model (drafts judged in order);
- the verifying step costs T(b(k + 1)): a plain step with that many one-token rows — the same
  tokens through the layers and the same logits rows through the head (the chunk's attention
  over its context is the only difference, small next to the weights on the models served here);
- self_draft also runs its draft ~k times per step at batch b (a catch-up chunk and k − 1
  one-token steps), each costing `draft_share` x T(b) (the quantized decoder's eager step against
  the served one's; 0.7 for int4 measured on SmolLM2 on CPU, docs/speculative.md);
- gain(b) = E·T(b) / (T(b(k + 1)) + k·draft_share·T(b)): tokens per second against plain decode.
Sizes slower than a larger one are first read as that one (noise only adds time; `monotone`).
The threshold is the largest b ≤ max_batch such that every size from 1 to b has gain ≥ 1 (the
planner drafts at every size up to it). When even batch 1 loses it is 1: a single row keeps
drafting and its measured acceptance (state.py's pause) decides, not this estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

__all__ = [
    "DEFAULT_MAX_BATCH",
    "EXPECTED_ACCEPTANCE",
    "SpecThreshold",
    "choose_max_batch",
    "expected_emitted",
    "monotone",
    "speculation_gain",
]

DEFAULT_MAX_BATCH = 8  # without a warm-up sweep (batch_warmup off) and without a setting

# expected acceptance per drafted token, by method: self_draft ~0.95 (issue 41 / bench.spec_exact
# on SmolLM2: 0.953); ngram 0.6, between free text (~0.25, where a row pauses drafting anyway) and
# quoting (~0.94): a row drafts only where its last tokens recur, so it is above the free-text rate
EXPECTED_ACCEPTANCE = {"ngram": 0.6, "self_draft": 0.95}
# self_draft: the draft's step as a share of the served model's at the same batch, by draft format
# (int4: 35 ms vs 49 ms per token on SmolLM2, 1 thread; int8 assumed a little dearer)
DRAFT_STEP_SHARE = {"int4": 0.7, "int8": 0.8}


@dataclass(frozen=True)
class SpecThreshold:
    max_batch: int  # a step with more sequences drafts nothing
    source: str  # "setting" (explicit) | "measured" (warm-up) | "default" (no warm-up)
    gain_at_1: float | None = None  # the model's tokens/s ratio at batch 1 (measured only)


def expected_emitted(acceptance: float, k: int) -> float:
    """Tokens a drafting row emits per step: 1 + a + … + a^k."""
    return sum(acceptance**i for i in range(k + 1))


def step_seconds(curve: Sequence[tuple[float, float]], tokens: float) -> float:
    """T(tokens) from measured (tokens, seconds) points of one-token rows: linear between them,
    flat below the first (a step costs at least that), at the last one's throughput past it."""
    points = sorted(curve)
    if tokens <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in pairwise(points):
        if tokens <= x1:
            return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
    x, y = points[-1]
    return y * tokens / x


def monotone(curve: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Each size's time made no more than any larger size's: a step with more rows is never
    cheaper, and on a shared machine noise only ever adds time, so a knot above a larger one's
    (a few steps preempted by another process) is the noise, not the curve."""
    points = sorted(curve)
    out: list[tuple[float, float]] = []
    low = float("inf")
    for x, y in reversed(points):
        low = min(low, y)
        out.append((x, low))
    return out[::-1]


def speculation_gain(
    curve: Sequence[tuple[float, float]],
    batch: int,
    k: int,
    acceptance: float,
    draft_share: float = 0.0,
) -> float:
    """Tokens/s with speculation over tokens/s without, at `batch` rows (the module's model)."""
    plain = step_seconds(curve, batch)
    spec = step_seconds(curve, batch * (k + 1)) + k * draft_share * plain
    return expected_emitted(acceptance, k) * plain / spec


def choose_max_batch(
    curve: Sequence[tuple[float, float]],
    k: int,
    acceptance: float,
    max_batch: int,
    draft_share: float = 0.0,
) -> SpecThreshold:
    """The largest b ≤ max_batch with gain ≥ 1 at every size 1..b; 1 when batch 1 loses.
    `curve`: (tokens, seconds) of plain steps of one-token rows, at least two distinct sizes."""
    if len({x for x, _ in curve}) < 2 or any(x <= 0 or y <= 0 for x, y in curve):
        raise ValueError(f"need step times at two batch sizes or more, got {list(curve)}")
    curve = monotone(curve)
    gain_at_1 = speculation_gain(curve, 1, k, acceptance, draft_share)
    if gain_at_1 < 1.0:
        return SpecThreshold(1, "measured", gain_at_1)
    chosen = 1
    for b in range(2, max_batch + 1):
        if speculation_gain(curve, b, k, acceptance, draft_share) < 1.0:
            break
        chosen = b
    return SpecThreshold(min(chosen, max(max_batch, 1)), "measured", gain_at_1)
