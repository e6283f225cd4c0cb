"""The step-time model and the throughput-share signal built on it, on scripted step times."""

from __future__ import annotations

import dataclasses
import random

import pytest

from runtime.engine.batching.fit import fit_nonnegative, fit_within
from runtime.engine.batching.step_model import StepCost, StepTimeModel
from runtime.engine.batching.throughput import ThroughputUtilization
from runtime.engine.batching.warmup import WarmupPlan
from runtime.engine.stats import StepStats


def step(
    tokens: int,
    seconds: float,
    *,
    sampled: int | None = None,
    pairs: int = 0,
    binds: bool = False,
    running: int = 0,
) -> StepStats:
    return StepStats(
        ts=0.0,
        step_id=1,
        num_seqs=sampled or tokens,
        num_prefill_tokens=0,
        num_decode_tokens=tokens,
        busy_seconds=seconds,
        num_running=running,
        num_waiting=0,
        batch_size_limit=64,
        num_sampled=sampled if sampled is not None else tokens,
        num_attention_pairs=pairs,
        limit_binds=binds,
    )


def scripted_model() -> StepTimeModel:
    """Every scripted step counts (no cold first step of a process or of a size to skip)."""
    return StepTimeModel(skip_first=0, skip_first_per_size=False)


def truth(tokens: int, pairs: int) -> float:
    return 0.008 + 0.0005 * tokens + 2e-6 * pairs


def saturating(tokens: float, rows: float, pairs: float) -> float:
    """Flat while reading the weights dominates, then linear: knee at 32 tokens."""
    return max(0.016, 0.0005 * tokens) + 0.0001 * rows + 2e-7 * pairs


def test_curve_goes_through_the_measured_knots_and_the_context_term_is_recovered() -> None:
    model = scripted_model()
    rng = random.Random(0)
    for _ in range(3000):
        tokens = rng.choice([1, 2, 4, 8, 16, 32, 64, 200])
        context = rng.randint(10, 2000)
        pairs = tokens * context
        model.observe(StepCost(tokens, tokens, pairs), truth(tokens, pairs))
    fit = model.fit()
    assert fit is not None
    # the within-bucket slope of the attention pairs is the device's, whatever the level per size
    assert fit.pair_seconds == pytest.approx(2e-6, rel=0.05)
    for tokens in (1, 4, 16, 64, 200):  # at a knot, the knot's own time at the queried context
        assert fit.predict((tokens, tokens, tokens * 500)) == pytest.approx(
            truth(tokens, tokens * 500), rel=0.03
        )
    # the same batch at a longer context costs more: more of its time is work, the share rises
    short = fit.saturation_share((16.0, 16.0, 16.0 * 100))
    long = fit.saturation_share((16.0, 16.0, 16.0 * 2000))
    assert long > short


def test_saturation_share_is_the_throughput_ratio_to_the_best_size_on_a_saturating_curve() -> None:
    """The affine fit read ~0.5 at the size that saturates such a device (issue 28)."""
    model = scripted_model()
    rng = random.Random(2)
    sizes = [1, 4, 8, 16, 24, 32, 48, 64]
    for _ in range(4000):
        n = rng.choice(sizes)
        context = rng.randint(50, 400)
        work = (n, n, n * context)
        model.observe(StepCost(*work), saturating(*work) * rng.uniform(0.95, 1.05))
    fit = model.fit()
    assert fit is not None
    best = max(n / saturating(n, n, n * 200) for n in sizes)
    for n in sizes:
        want = n / saturating(n, n, n * 200) / best
        assert fit.saturation_share((n, n, n * 200)) == pytest.approx(want, abs=0.05), n
    assert fit.saturation_share((32, 32, 32 * 200)) > 0.95


def test_fit_under_relative_noise_and_outliers() -> None:
    model = scripted_model()
    rng = random.Random(1)
    for i in range(3000):
        tokens = rng.choice([1, 4, 16, 64, 256])
        seconds = (0.01 + 0.001 * tokens) * rng.uniform(0.9, 1.1)
        if i % 100 == 50:
            seconds *= 50  # a step preempted by another process
        model.observe(StepCost(tokens, tokens, 0), seconds)
    fit = model.fit()
    assert fit is not None
    # the affine device's best measured size is 256: 16 tokens deliver (16/26) / (256/266)
    assert fit.saturation_share((16.0, 16.0, 0.0)) == pytest.approx(16 / 26 / (256 / 266), abs=0.05)


def test_no_fit_without_enough_spread() -> None:
    model = scripted_model()
    assert model.fit() is None
    for _ in range(50):
        model.observe(StepCost(8, 8, 0), 0.02)
    assert model.fit() is None  # one size: nothing to compare its throughput with
    for _ in range(50):
        model.observe(StepCost(11, 11, 0), 0.023)  # another bucket, but only 1.4x apart
    assert model.fit() is None
    model.observe(StepCost(32, 32, 0), 0.044)
    assert model.fit() is not None


def test_slopes_are_never_negative_and_first_step_is_skipped() -> None:
    model = StepTimeModel()  # skip_first=1: a cold first forward
    model.observe(StepCost(1, 1, 0), 5.0)
    for rows in (1, 4, 16, 64):
        for k in range(5):
            # more prefill tokens made steps *faster* here: noise, never physics
            tokens = rows + 8 * k
            model.observe(StepCost(tokens, rows, 0), 0.01 + 0.001 * rows - 1e-5 * tokens)
    fit = model.fit()
    assert fit is not None and fit.token_seconds >= 0.0 and fit.pair_seconds >= 0.0
    # the knot is the mean of its five steps: the 5 s step was not used
    assert fit.knots[0].seconds == pytest.approx(0.011 - 1e-5 * 17, rel=0.01)


def test_prefill_tokens_are_costed_within_a_batch_size() -> None:
    """Steps of one batch with and without prompts joining: the knot moves to the queried mix."""
    model = scripted_model()
    rng = random.Random(3)
    for _ in range(3000):
        rows = rng.choice([1, 4, 16, 32, 64])
        tokens = rows + 40 * rng.choice([0, 0, 0, 1, 2])  # decode, or prompts of 40 joining
        model.observe(StepCost(tokens, rows, 0), saturating(tokens, rows, 0))
    fit = model.fit()
    assert fit is not None and fit.token_seconds > 0
    for rows in (1, 16, 64):
        decode = (float(rows), float(rows), 0.0)
        assert fit.predict(decode) == pytest.approx(saturating(*decode), rel=0.1), rows


def test_a_bucket_moves_only_with_steps_of_its_size() -> None:
    """Hours at one size leave the other knots where they were measured (no drift)."""
    model = scripted_model()
    for tokens in (1, 4, 16, 64):
        model.observe(StepCost(tokens, tokens, 0), saturating(tokens, tokens, 0))
    before = model.fit()
    for i in range(20_000):
        model.observe(StepCost(16, 16, 16 * (100 + i % 900)), saturating(16, 16, 16 * 500))
    after = model.fit()
    assert before is not None and after is not None
    kept = [k for k in after.knots if k.features[0] != 16]
    assert kept == [k for k in before.knots if k.features[0] != 16]


def test_fit_helpers() -> None:
    assert fit_nonnegative([], [], []) is None
    b0, slopes = fit_nonnegative([(1.0,), (2.0,), (3.0,)], [3.0, 5.0, 7.0], [1.0, 1.0, 1.0]) or (
        0,
        [],
    )
    assert b0 == pytest.approx(1.0, abs=1e-4) and slopes[0] == pytest.approx(2.0, abs=1e-4)
    # within covariances of y = 2 x0 + 3 x1 (x0, x1 independent, unit variance)
    assert fit_within([[1.0, 0.0], [0.0, 1.0]], [2.0, 3.0], ridge=0.0) == pytest.approx([2.0, 3.0])
    # a negative slope is dropped, a column without variance says nothing
    assert fit_within([[1.0, 0.0], [0.0, 0.0]], [-1.0, 0.0]) == [0.0, 0.0]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_signal_is_busy_fraction_times_saturation_share() -> None:
    clock = Clock()
    source = ThroughputUtilization(scripted_model(), window_s=1.0, clock=clock)
    assert source.read() is None  # no model yet: no data
    for tokens in (1, 4, 16, 64):
        for _ in range(3):  # a knot stands for the saturation throughput from 3 steps on
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
    # 16 tokens in 26 ms against the best measured size, 64 tokens in 74 ms
    assert reading.saturation_share == pytest.approx(16 / 26 / (64 / 74), abs=0.01)
    assert reading.utilization == pytest.approx(0.52 * 16 / 26 / (64 / 74), abs=0.01)
    assert reading.binding_fraction == pytest.approx(0.75)
    assert source.demand().limit_binds and source.demand().num_seqs == 16
    assert source.demand().queue_wait_s == 0.0  # the steps reported no wait
    clock.t += 0.05
    waiting = dataclasses.replace(step(16, 0.026, binds=True), queue_wait_s=2.5, num_waiting=7)
    source.observe(waiting)
    assert source.demand().queue_wait_s == 2.5  # the latest step's: the controller's queue term
    assert source.demand().num_waiting == 7  # ... and how many wait: room for them at once


def test_warmup_plan_spans_the_batch_range() -> None:
    assert WarmupPlan.for_max_batch(64).batch_sizes == (1, 2, 4, 8, 16, 32, 64)
    assert WarmupPlan.for_max_batch(16).batch_sizes == (1, 2, 4, 8, 16)
    assert WarmupPlan.for_max_batch(100).batch_sizes == (1, 2, 4, 8, 16, 32, 64, 100)
    assert WarmupPlan.for_engine(8).batch_sizes == (1, 2, 4, 8, 16, 32, 64)  # at least to 64
    assert WarmupPlan.for_max_batch(1).batch_sizes == (1,)


def test_a_step_in_flight_is_busy_time_not_idle_time() -> None:
    """Busy time is recorded when a step ends. A loaded machine: 1.5 s steps, a 1 s window that
    often holds no step end. With sequences still running after the last step, the time since
    is a step in flight: u reads the device busy (it read ~0 in bench.batching before)."""
    clock = Clock()
    source = ThroughputUtilization(scripted_model(), window_s=1.0, clock=clock)
    for tokens in (1, 4, 16, 64):
        clock.t += 1.0 + 0.01 * tokens
        source.observe(step(tokens, 1.0 + 0.01 * tokens, running=tokens))
    for _ in range(5):
        clock.t += 1.64
        source.observe(step(64, 1.64, running=64))
    clock.t += 1.2  # the next step has run for 1.2 s
    reading = source.reading()
    assert reading.num_steps == 0
    assert reading.busy_fraction == pytest.approx(1.0)
    assert reading.utilization == pytest.approx(1.0, abs=0.02)  # 64 tokens is the best size
    # the same with nothing left to run: the engine went idle after its last step
    idle = ThroughputUtilization(scripted_model(), window_s=1.0, clock=clock)
    for tokens in (1, 4, 16, 64):
        clock.t += 1.0
        idle.observe(step(tokens, 0.5 + 0.01 * tokens))
    clock.t += 1.2
    assert idle.reading().utilization == 0.0


def test_the_first_step_of_each_size_is_skipped() -> None:
    """A new batch shape's first forward pays one-off costs: it must not seed the knot."""
    model = StepTimeModel(skip_first=0)
    for rows in (1, 4, 16, 64):
        model.observe(StepCost(rows, rows, 0), 10.0)  # cold
        for _ in range(3):
            model.observe(StepCost(rows, rows, 0), 0.01 + 0.001 * rows)
    fit = model.fit()
    assert fit is not None
    assert [k.seconds for k in fit.knots] == pytest.approx([0.011, 0.014, 0.026, 0.074])
