"""The utilization-source protocol (a 0–1 ratio, or None = no data) and its simple members.

- `BusyTracker`: the engine reports the seconds it spent in `execute()`; `fraction()` is the busy
  share of a trailing window (a duty cycle: the engine's busy fraction, exported as
  `fastllm_device_busy_ratio` on CPU and one factor of the controller's input).
- `BusyFractionSource`: a callable as a source (e.g. `engine.busy_fraction`).
- `FakeUtilization`: settable or scripted, for tests.

The engine's controller reads `ThroughputUtilization` (runtime.engine.batching.throughput); NVML's
duty cycle and GPM tensor activity are cross-checks read by `monitoring`, never the input: a duty
cycle reads ~1 under any backlog whatever the batch. `runtime.engine.batching.controller`
re-exports all of these; import them from there.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from runtime.errors import ConfigError


@dataclass(frozen=True)
class Demand:
    """Whether the batch limit is what holds the engine back, over the source's window."""

    limit_binds: bool  # most steps left requests waiting with the batch at the limit
    num_seqs: int | None  # sequences in the latest step (None: no step in the window)
    # how long the head of the queue had waited at the latest binding step (None: not known)
    queue_wait_s: float | None = None
    # requests left waiting after the latest step (None: not known)
    num_waiting: int | None = None


@runtime_checkable
class DemandSignal(Protocol):
    def demand(self) -> Demand: ...


@runtime_checkable
class UtilizationSource(Protocol):
    def read(self) -> float | None:
        """Utilization over the last interval in [0, 1]; None when there is nothing to report."""
        ...


def _clean(value: float | None) -> float | None:
    if value is None or math.isnan(value):
        return None
    return min(1.0, max(0.0, float(value)))


class FakeUtilization:
    """`set(value)` for a fixed reading, or a script of readings consumed one per `read()` (the last
    one repeats once the script is exhausted)."""

    def __init__(self, value: float | None = None, *, script: Iterable[float | None] = ()) -> None:
        self._value = value
        self._script: deque[float | None] = deque(script)
        self.num_reads = 0

    def set(self, value: float | None) -> None:
        self._value = value

    def read(self) -> float | None:
        self.num_reads += 1
        if self._script:
            self._value = self._script.popleft()
        return _clean(self._value)


class BusyTracker:
    """Busy seconds reported by the engine; `fraction(now)` = busy share of the trailing window.

    Thread-safe. Intervals are stored as (start, end) on the tracker's clock (monotonic by default),
    so a busy period that straddles the window edge counts only its part inside the window.
    """

    def __init__(
        self, window_s: float = 1.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not window_s > 0:
            raise ConfigError(f"window_s must be > 0, got {window_s}", param="window_s")
        self.window_s = window_s
        self._clock = clock
        self._created = clock()
        self._intervals: deque[tuple[float, float]] = deque()
        self._lock = threading.Lock()

    def add_busy(self, seconds: float, end: float | None = None) -> None:
        """Record `seconds` of busy time ending at `end` (default: now)."""
        if seconds <= 0:
            return
        end = self._clock() if end is None else end
        with self._lock:
            self._intervals.append((end - seconds, end))
            # prune on write as well: with an NVML source nobody may call fraction(), and one
            # interval per engine step would otherwise accumulate forever
            while self._intervals and self._intervals[0][1] <= end - self.window_s:
                self._intervals.popleft()

    def fraction(self, now: float | None = None) -> float | None:
        """Busy share of [now - window, now]; a young tracker uses its age as the window."""
        now = self._clock() if now is None else now
        span = min(self.window_s, now - self._created)
        if span <= 0:
            return None
        lo = now - span
        with self._lock:
            while self._intervals and self._intervals[0][1] <= now - self.window_s:
                self._intervals.popleft()
            busy = sum(max(0.0, min(e, now) - max(s, lo)) for s, e in self._intervals)
        return min(1.0, busy / span)


class BusyFractionSource:
    """Wraps a callable that returns the engine's busy fraction (e.g. `engine.busy_fraction`)."""

    def __init__(self, fn: Callable[[], float | None]) -> None:
        self._fn = fn

    @classmethod
    def from_tracker(cls, tracker: BusyTracker) -> BusyFractionSource:
        return cls(tracker.fraction)

    def read(self) -> float | None:
        return _clean(self._fn())
