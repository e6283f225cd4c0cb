"""bench.telemetry's helpers: the overhead arithmetic and the timing wrapper around the sinks."""

from __future__ import annotations

import threading

import pytest

from bench.telemetry import overhead_pct
from bench.telemetry_parts import RoundResult, TimedSink, thread_cpu_s
from runtime.engine.stats import FanOut, RequestStats


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[object, tuple[str, ...]]] = []

    def record(self, step=None, finished=(), verified=()):  # type: ignore[no-untyped-def]
        sum(range(20_000))  # some CPU for the wrapper to count
        self.calls.append((step, tuple(r.request_id for r in finished)))


def test_timed_sink_forwards_and_counts_cpu() -> None:
    inner = _Recorder()
    sink = TimedSink(FanOut([inner]))
    for i in range(50):
        sink.record(finished=[RequestStats(f"r{i}", "m")])
    assert inner.calls == [(None, (f"r{i}",)) for i in range(50)]
    assert sink.cpu_s > 0


def test_overhead_and_share() -> None:
    assert overhead_pct(2.0, 2.1) == pytest.approx(5.0)
    assert overhead_pct(2.0, 1.9) == pytest.approx(-5.0)
    result = RoundResult(num_tokens=100, wall_s=2.0, cpu_s=1.02, num_spans=3, telemetry_cpu_s=0.02)
    assert result.telemetry_share_pct == pytest.approx(2.0)
    assert result.tokens_per_s == pytest.approx(50.0)


def test_thread_cpu_counts_only_the_named_threads() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    worker = threading.Thread(target=spin, name="BenchSpinner")
    worker.start()
    try:
        stop.wait(0.3)
        assert thread_cpu_s("BenchSpinner") > 0
        assert thread_cpu_s("NoSuchThreadName") == 0
    finally:
        stop.set()
        worker.join()
