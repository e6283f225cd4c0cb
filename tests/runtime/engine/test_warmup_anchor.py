"""The warm-up sweep as the reference curve's shape (issue 28, found on the `small` llama).

The sweep runs a few steps per size before the process is warm; on a real CPU they ran slower
than the live steps of the same size. Compared as absolute times, every size the live traffic
never runs looked slower than the live one, and u read ~1 at every pinned batch. Sealed as a
reference and scaled by the live size's own live/reference ratio, the sweep's shape holds.

The truth here is measured on the scripted device as bench.batching measures it: the delivered
throughput at the pinned batch ÷ the best of the pinned batches 1..64 (none of the model in it).
"""

from __future__ import annotations

import functools
import random

import pytest

from runtime.engine.batching.step_model import StepCost, StepTimeModel
from runtime.engine.batching.warmup import WarmupPlan

COLD = 1.6  # the sweep's steps this much slower than warm live ones (as measured on CPU)
PROMPT = 40  # the live load's prompt tokens


def device(tokens: float, rows: float, pairs: float) -> float:
    """Flat while reading the weights dominates, then linear: knee at 24 tokens."""
    return max(0.024, 0.001 * tokens) + 0.0002 * rows + 4e-7 * pairs


def sweep(model: StepTimeModel, rng: random.Random) -> None:
    """The engine's sweep (1-token prompts, 5 tokens each), measured cold."""
    plan = WarmupPlan.for_engine(64)
    for size in plan.batch_sizes:
        for k in range(plan.new_tokens):
            work = (float(size), float(size), float(size * (k + 1)))
            model.observe(StepCost(size, size, size * (k + 1)), COLD * device(*work) * noise(rng))


def noise(rng: random.Random) -> float:
    return 1.0 + rng.uniform(-0.05, 0.05)


def live(model: StepTimeModel | None, batch: int, rng: random.Random, steps: int = 300) -> float:
    """A pinned batch under a closed-loop backlog: each sequence prefills a 40-token prompt, then
    decodes 48 to 80 tokens at a growing context, and is replaced by a new one when it ends.
    Returns the sequences advanced per second (what tokens/s measures)."""
    seqs: list[list[int]] = []  # [context, tokens left]
    total_s = 0.0
    for _ in range(steps):
        seqs = [s for s in seqs if s[1] > 0]
        joined = batch - len(seqs)
        tokens = len(seqs) + PROMPT * joined
        pairs = sum(c + 1 for c, _ in seqs) + joined * PROMPT * (PROMPT + 1) // 2
        seqs = [[c + 1, left - 1] for c, left in seqs]
        seqs += [[PROMPT, rng.randint(48, 80) - 1] for _ in range(joined)]
        seconds = device(tokens, batch, pairs)
        total_s += seconds
        if model is not None:
            model.observe(StepCost(tokens, batch, pairs), seconds * noise(rng))
    return batch * steps / total_s


@functools.cache
def true_ratio(batch: int) -> float:
    """The truth, measured as bench.batching measures it: the delivered throughput at this pinned
    batch ÷ the best pinned batch's, the same load on the device (steps are bursty: a prompt
    joining pushes a step past the knee, so the mean work's step time is not the truth)."""

    def rate(n: int) -> float:
        return live(None, n, random.Random(n), steps=600)

    return rate(batch) / max(rate(m) for m in range(1, 65))


@pytest.mark.parametrize("batch", [2, 4, 8, 16, 24, 32, 64])
def test_u_reads_the_true_ratio_when_the_sweep_ran_cold(batch: int) -> None:
    rng = random.Random(batch)
    model = StepTimeModel(skip_first=0)
    sweep(model, rng)
    model.seal_warmup()
    live(model, batch, rng)
    fit = model.fit()
    assert fit is not None and len(fit.reference) == 7 and len(fit.knots) == 1
    share = fit.share_of_bucket(StepTimeModel.bucket_of(batch))
    assert share is not None
    assert share == pytest.approx(true_ratio(batch), abs=0.1), (batch, share)


def test_unsealed_the_cold_sweep_makes_the_live_size_look_best() -> None:
    """The failure the reference fixes, as it was: the same steps, the sweep not sealed."""
    rng = random.Random(0)
    model = StepTimeModel(skip_first=0)
    sweep(model, rng)
    live(model, 8, rng)
    fit = model.fit()
    assert fit is not None and not fit.reference
    share = fit.share_of_bucket(StepTimeModel.bucket_of(8))
    assert share is not None and share - true_ratio(8) > 0.1, share  # outside the ±0.1


def test_before_any_live_step_the_model_has_a_fit_but_no_reading() -> None:
    """After the sweep an idle engine reads u = 0 (a fit exists); a size with no live step has
    no share yet (its first step, often one big prefill, is skipped): the controller holds."""
    model = StepTimeModel(skip_first=0)
    sweep(model, random.Random(1))
    model.seal_warmup()
    fit = model.fit()
    assert fit is not None and not fit.knots
    assert fit.share_of_bucket(StepTimeModel.bucket_of(16)) is None


def test_only_a_truly_flat_top_is_extrapolated() -> None:
    """The flat-tail extrapolation (the runbook's flat-T(n) case: u reads low at the cap) needs
    the top knots' time to grow by at most a tenth of their batch's growth. A top that merely
    looks flattish (64 rows in 1.3x the time of 32: a few noisy steps on a loaded CPU) is the
    measured best, not a 4x extrapolation (which read u ~0.1 at a batch delivering half)."""
    model = StepTimeModel(skip_first=0)
    for rows, seconds in ((1, 0.010), (4, 0.012), (16, 0.030), (32, 0.060), (64, 0.078)):
        for _ in range(4):
            model.observe(StepCost(rows, rows, rows), seconds)
    fit = model.fit()
    assert fit is not None
    best = 64 / 0.078
    assert fit.share_of_bucket(StepTimeModel.bucket_of(16)) == pytest.approx(16 / 0.030 / best)
    flat = StepTimeModel(skip_first=0)
    for rows in (1, 4, 16, 32, 64):
        for _ in range(4):
            flat.observe(StepCost(rows, rows, rows), 0.050 + 0.00001 * rows)
    fit = flat.fit()
    assert fit is not None
    share = fit.share_of_bucket(StepTimeModel.bucket_of(64))
    assert share is not None and share < 0.5  # still flat at the cap: reads low there


def test_whether_the_top_is_flat_is_the_sweeps_call() -> None:
    """Live knots measured at different loads (32 while the machine was busy, 64 once quiet) can
    make the top look flat; the sweep, all its sizes measured within seconds, says it is not: the
    best measured batch reads 1, not a quarter (it read 0.12 on the small llama)."""
    model = StepTimeModel(skip_first=0)
    for rows in (1, 2, 4, 8, 16, 32, 64):
        for _ in range(5):
            model.observe(StepCost(rows, rows, rows), max(0.010, 0.00125 * rows))
    model.seal_warmup()
    for rows, seconds in ((32, 0.070), (64, 0.075)):
        for _ in range(10):
            model.observe(StepCost(rows, rows, rows), seconds)
    fit = model.fit()
    assert fit is not None
    assert fit.share_of_bucket(StepTimeModel.bucket_of(64)) == pytest.approx(1.0)
