"""bench.batching's pure helpers: scrape parsing, histogram quantiles, window and settle stats."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench.batching_parts import Scrape, histogram_quantile, settle_stats, window_stats


def test_histogram_quantile_matches_prometheus_interpolation() -> None:
    before = {0.1: 2.0, 0.5: 2.0, 1.0: 2.0, math.inf: 2.0}
    after = {0.1: 2.0, 0.5: 6.0, 1.0: 10.0, math.inf: 10.0}  # 4 in (0.1, 0.5], 4 in (0.5, 1]
    # rank 4 of 8 is the last of the (0.1, 0.5] bucket
    assert histogram_quantile(0.5, before, after) == pytest.approx(0.5)
    assert histogram_quantile(0.25, before, after) == pytest.approx(0.1 + 0.4 * 2 / 4)
    assert histogram_quantile(0.5, after, after) is None  # nothing observed in between


def test_scrape_parses_the_server_series_and_windows_use_deltas() -> None:
    registry = CollectorRegistry()
    tpot = Histogram(
        "fastllm_time_per_output_token_seconds",
        "x",
        ["model"],
        buckets=(0.05, 0.1, 0.2),
        registry=registry,
    )
    batch = Histogram("fastllm_batch_size", "x", ["model"], buckets=(8, 32), registry=registry)
    first = Scrape.parse(0.0, generate_latest(registry).decode())
    for _ in range(10):  # ten steps of 16 sequences over 2 s, four requests finished
        batch.labels("m").observe(16)
    for value in (0.06, 0.07, 0.08, 0.15):
        tpot.labels("m").observe(value)
    second = Scrape.parse(2.0, generate_latest(registry).decode())
    stats = window_stats([first, second], 0.0, 2.0)
    assert stats["tokens_per_s"] == 80.0 and stats["step_interval_s"] == 0.2
    assert stats["tpot_p50_s"] == pytest.approx(0.05 + 0.05 * 2 / 3, abs=1e-4)
    assert stats["ttft_p50_s"] is None
    assert window_stats([first], 0.0, 2.0)["tokens_per_s"] is None


def test_settle_stats_finds_the_steady_state() -> None:
    limits = [16, 19, 23, 27, 32, 38, 34, 34, 34, 34, 37, 34, 34, 37, 34, 34, 34, 34, 34, 34]
    trace = [{"t": float(t), "limit": float(n), "u": 0.7} for t, n in enumerate(limits)]
    trace[-1]["u"] = math.nan  # a scrape without a reading does not count
    stats = settle_stats(trace, interval_s=1.0)
    # the second half moves between 34 and 37; it stays there from t = 6 on (38 was outside)
    assert stats["settle_intervals"] == 5.0
    assert stats["limit_changes_per_min"] == pytest.approx(3 / (9 / 60), rel=0.01)
    assert stats["utilization"] == 0.7
    assert settle_stats(trace[:2], 1.0)["settle_intervals"] is None
