"""The busy-fraction tracker on a virtual clock (NVML's readers are monitoring's cross-checks:
tests/monitoring/test_device_activity.py)."""

from __future__ import annotations

import pytest

from runtime.engine.batching.controller import (
    AdaptiveBatchController,
    BatchPolicyConfig,
    BusyFractionSource,
    BusyTracker,
)
from runtime.errors import ConfigError


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_busy_tracker_fraction_over_window() -> None:
    clock = Clock(100.0)
    tracker = BusyTracker(window_s=2.0, clock=clock)
    clock.t = 101.0
    tracker.add_busy(0.25)  # [100.75, 101.0]
    assert tracker.fraction() == pytest.approx(0.25)  # young tracker: window = its 1 s age
    clock.t = 102.0
    tracker.add_busy(0.5)  # [101.5, 102.0]
    assert tracker.fraction() == pytest.approx(0.75 / 2.0)
    # at 103.0 the window is [101.0, 103.0]: the first interval has left it
    assert tracker.fraction(103.0) == pytest.approx(0.5 / 2.0)
    # at 103.75 the window [101.75, 103.75] cuts the second interval in half
    assert tracker.fraction(103.75) == pytest.approx(0.25 / 2.0)
    assert tracker.fraction(110.0) == 0.0


def test_busy_tracker_edge_cases() -> None:
    clock = Clock(5.0)
    tracker = BusyTracker(window_s=1.0, clock=clock)
    assert tracker.fraction() is None  # no time has passed
    tracker.add_busy(0.0)
    tracker.add_busy(-1.0)
    clock.t = 7.0
    tracker.add_busy(3.0)  # longer than the window: saturates, never above 1
    assert tracker.fraction() == 1.0
    with pytest.raises(ConfigError):
        BusyTracker(window_s=0.0)


def test_busy_fraction_source_feeds_the_controller() -> None:
    clock = Clock(0.0)
    tracker = BusyTracker(window_s=1.0, clock=clock)
    ctl = AdaptiveBatchController(
        BatchPolicyConfig(initial=10), BusyFractionSource.from_tracker(tracker), clock=clock
    )
    ctl.maybe_update()
    clock.t = 1.0
    tracker.add_busy(0.9)
    assert ctl.maybe_update() == 9  # 90% busy > 0.8: shrink
    clock.t = 2.0
    tracker.add_busy(0.2)
    assert ctl.maybe_update() == 11  # 20% busy < 0.6: grow (10 * 0.9 -> 9 -> 9 * 1.2 = 10.8)


def test_busy_tracker_stays_bounded_when_nobody_reads_it() -> None:
    # with nobody reading fraction() (metrics off), add_busy must prune itself
    now = [0.0]
    tracker = BusyTracker(window_s=1.0, clock=lambda: now[0])
    for _ in range(10_000):
        now[0] += 0.01
        tracker.add_busy(0.005)
    assert len(tracker._intervals) <= 101
    assert tracker.fraction() == pytest.approx(0.5, abs=0.01)
