"""The step-time model and the throughput-share signal built on it, on scripted step times."""

from __future__ import annotations

import random

import pytest

from runtime.engine.batching.fit import fit_nonnegative
from runtime.engine.batching.step_model import StepCost, StepTimeModel
from runtime.engine.batching.throughput import ThroughputUtilization
from runtime.engine.batching.warmup import WarmupPlan
from runtime.engine.stats import StepStats


def step(tokens: int, seconds: float, *, sampled: int | None = None, pairs: int = 0, binds=False):
    return StepStats(
        ts=0.0,
        step_id=1,
        num_seqs=sampled or tokens,
        num_prefill_tokens=0,
        num_decode_tokens=tokens,
        busy_seconds=seconds,
        num_running=0,
        num_waiting=0,
        batch_size_limit=64,
        num_sampled=sampled if sampled is not None else tokens,
        num_attention_pairs=pairs,
        limit_binds=binds,
    )


def truth(tokens: int, pairs: int) -> float:
    return 0.008 + 0.0005 * tokens + 2e-6 * pairs


def test_fit_recovers_fixed_cost_token_and_context_terms() -> None:
    model = StepTimeModel(skip_first=0)
    rng = random.Random(0)
    for _ in range(2000):
        tokens = rng.choice([1, 2, 4, 8, 16, 32, 64, 200])
        context = rng.randint(10, 2000)
        pairs = tokens * context
        model.observe(StepCost(tokens, tokens, pairs), truth(tokens, pairs))
    fit = model.fit()
    assert fit is not None
    assert fit.fixed_seconds == pytest.approx(0.008, rel=0.02)
    assert fit.slopes[0] + fit.slopes[1] == pytest.approx(0.0005, rel=0.02)  # tokens == rows here
    assert fit.slopes[2] == pytest.approx(2e-6, rel=0.05)
    # the same batch at a longer context costs more, so it delivers more of its saturation share
    short = fit.saturation_share((16.0, 16.0, 16.0 * 100))
    long = fit.saturation_share((16.0, 16.0, 16.0 * 2000))
    assert long > short
    assert short == pytest.approx(1 - 0.008 / truth(16, 1600), abs=0.01)


def test_fit_under_relative_noise_and_outliers() -> None:
    model = StepTimeModel(skip_first=0)
    rng = random.Random(1)
    for i in range(3000):
        tokens = rng.choice([1, 4, 16, 64, 256])
        seconds = (0.01 + 0.001 * tokens) * rng.uniform(0.9, 1.1)
        if i % 100 == 50:
            seconds *= 50  # a step preempted by another process
        model.observe(StepCost(tokens, tokens, 0), seconds)
    fit = model.fit()
    assert fit is not None
    assert fit.fixed_seconds == pytest.approx(0.01, rel=0.15)
    assert fit.saturation_share((16.0, 16.0, 0.0)) == pytest.approx(16 / 26, abs=0.05)


def test_no_fit_without_enough_spread() -> None:
    model = StepTimeModel(skip_first=0)
    assert model.fit() is None
    for _ in range(50):
        model.observe(StepCost(8, 8, 0), 0.02)
    assert model.fit() is None  # one size: the intercept is not identifiable
    for _ in range(50):
        model.observe(StepCost(11, 11, 0), 0.023)  # another bucket, but only 1.4x apart
    assert model.fit() is None
    model.observe(StepCost(32, 32, 0), 0.044)
    assert model.fit() is not None


def test_slopes_are_never_negative_and_first_step_is_skipped() -> None:
    model = StepTimeModel()  # skip_first=1: a cold first forward
    model.observe(StepCost(1, 1, 0), 5.0)
    for tokens in (1, 4, 16, 64):
        for _ in range(5):
            # more sampled rows made steps *faster* here: noise, never physics
            model.observe(StepCost(tokens, 64 - tokens + 1, 0), 0.01 + 0.001 * tokens)
    fit = model.fit()
    assert fit is not None and min(fit.slopes) >= 0.0
    assert fit.fixed_seconds == pytest.approx(0.01, rel=0.05)  # the 5 s step was not used


def test_fit_nonnegative_helper() -> None:
    assert fit_nonnegative([], [], []) is None
    b0, slopes = fit_nonnegative([(1.0,), (2.0,), (3.0,)], [3.0, 5.0, 7.0], [1.0, 1.0, 1.0]) or (
        0,
        [],
    )
    assert b0 == pytest.approx(1.0, abs=1e-4) and slopes[0] == pytest.approx(2.0, abs=1e-4)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_signal_is_busy_fraction_times_saturation_share() -> None:
    clock = Clock()
    source = ThroughputUtilization(StepTimeModel(skip_first=0), window_s=1.0, clock=clock)
    assert source.read() is None  # no model yet: no data
    for tokens in (1, 4, 16, 64):
        clock.t += 0.1
        source.observe(step(tokens, 0.01 + 0.001 * tokens))
    clock.t = 10.0  # a quiet second later: idle window, the model stays
    reading = source.reading()
    assert reading.utilization == 0.0 and reading.num_steps == 0
    assert not source.demand().limit_binds and source.demand().num_seqs is None
    # 20 steps of 16 tokens (26 ms each) in a second, three of four binding: busy 0.52
    for i in range(20):
        clock.t += 0.05
        source.observe(step(16, 0.026, binds=i % 4 != 0))
    reading = source.reading()
    assert reading.busy_fraction == pytest.approx(0.52, abs=0.01)
    assert reading.saturation_share == pytest.approx(16 / 26, abs=0.01)
    assert reading.utilization == pytest.approx(0.52 * 16 / 26, abs=0.01)
    assert reading.binding_fraction == pytest.approx(0.75)
    assert source.demand().limit_binds and source.demand().num_seqs == 16


def test_warmup_plan_spans_the_batch_range() -> None:
    assert WarmupPlan.for_max_batch(64).batch_sizes == (1, 4, 16, 64)
    assert WarmupPlan.for_max_batch(16).batch_sizes == (1, 4, 16)
    assert WarmupPlan.for_max_batch(100).batch_sizes == (1, 4, 16, 64, 100)
    assert WarmupPlan.for_max_batch(1).batch_sizes == (1,)
