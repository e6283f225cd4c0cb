"""The soak's pure helpers: the figures it reports and the sink that samples memory."""

from __future__ import annotations

import statistics

import pytest

from bench.soak_run import (
    MemorySample,
    SamplingSink,
    after_warmup,
    fluctuation_pct,
    growth_pct,
    summarize,
)
from runtime.engine.stats import AllocatorStats, RequestStats, StepStats, TierStats


def _sample(n: int, rss: int, footprint: int = 100) -> MemorySample:
    return MemorySample(n, rss, bytes_in_use=0, footprint_bytes=footprint, live_blocks=0)


def test_fluctuation_is_largest_deviation_over_mean() -> None:
    values = [90.0, 100.0, 110.0, 104.0]
    mean = statistics.fmean(values)
    assert fluctuation_pct(values) == pytest.approx(100 * (mean - 90.0) / mean)
    assert fluctuation_pct([5.0] * 7) == 0.0
    assert fluctuation_pct([3.0, 6.0]) == pytest.approx(fluctuation_pct([30.0, 60.0]))


def test_growth_compares_the_ends() -> None:
    ramp = [100.0 + i for i in range(20)]  # 10% of 20 = 2 samples at each end
    first, last = statistics.fmean(ramp[:2]), statistics.fmean(ramp[-2:])
    assert growth_pct(ramp) == pytest.approx(100 * (last - first) / first)
    assert growth_pct(list(reversed(ramp))) < 0
    assert growth_pct([7.0, 7.0, 7.0]) == 0.0  # fewer than 10 samples: one at each end


def test_warmup_drops_the_first_tenth_of_the_requests() -> None:
    samples = [_sample(n, 1) for n in range(100, 1001, 100)]
    kept = after_warmup(samples, 1000)
    assert [s.num_requests for s in kept] == list(range(200, 1001, 100))


def test_summarize_ignores_warmup_samples() -> None:
    steady = [_sample(n, 1000 + (n // 100) % 2) for n in range(200, 1001, 100)]
    spike = _sample(100, 5000, footprint=900)  # warm-up: must not count
    figures = summarize(
        [spike, *steady], 1000, live_blocks_after_drain=0, leaks=0, failed_requests=0, seconds=1
    )
    rss = [float(s.rss_bytes) for s in steady]
    assert figures.rss_fluctuation_pct == pytest.approx(fluctuation_pct(rss), abs=1e-3)
    assert figures.allocator_fluctuation_pct == 0.0
    with pytest.raises(ValueError):
        summarize([spike], 1000, live_blocks_after_drain=0, leaks=0, failed_requests=0, seconds=1)


def _step(allocator: AllocatorStats) -> StepStats:
    return StepStats(
        ts=0.0,
        step_id=1,
        num_seqs=1,
        num_prefill_tokens=0,
        num_decode_tokens=1,
        busy_seconds=0.0,
        num_running=1,
        num_waiting=0,
        batch_size_limit=1,
        allocator=allocator,
    )


def test_sampling_sink_samples_once_per_interval() -> None:
    tier = TierStats("small", bytes_in_use=10, bytes_cached=30, live_blocks=2)
    step = _step(AllocatorStats("cpu", (tier,)))
    sink = SamplingSink(interval=3)
    for i in range(10):  # 2 finished per step, one failed in all
        done = [RequestStats(f"r{i}a", "m"), RequestStats(f"r{i}b", "m")]
        done[0].failure_reason = "timeout" if i == 4 else None
        sink.record(step=step, finished=done)
    sink.record(step=None, finished=[RequestStats("late", "m")])  # no step: no sample
    assert [s.num_requests for s in sink.samples] == [4, 6, 10, 12, 16, 18]
    assert sink.num_finished == 21 and sink.num_failed == 1
    assert {(s.bytes_in_use, s.footprint_bytes, s.live_blocks) for s in sink.samples} == {
        (10, 40, 2)
    }
    assert all(s.rss_bytes > 0 for s in sink.samples)
