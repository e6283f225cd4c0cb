"""Where the adaptive batch policy reads device utilization from (a 0–1 ratio, or None = no data).

- `NvmlUtilization`: NVML's "GPU busy" ratio on CUDA (percent of the last sample period, 1/6–1 s,
  in which any kernel ran).
- `BusyFractionSource` + `BusyTracker`: on CPU the engine reports the seconds it spent in
  `execute()`; the fraction of wall time that was busy over a window stands in for utilization.
- `FakeUtilization`: settable or scripted, for tests.

`runtime.engine.batching.controller` re-exports all of these; import them from there.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from runtime.errors import ConfigError


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


def _nvml_index(device: str | int) -> int | str:
    """NVML numbers physical GPUs; torch's `cuda:N` counts only CUDA_VISIBLE_DEVICES. Map N back to
    the physical index (or to a `GPU-…` UUID when the variable lists UUIDs)."""
    if isinstance(device, int):
        n = device
    else:
        _, _, idx = device.partition(":")
        n = int(idx) if idx else 0
    visible = [
        v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()
    ]
    if n < len(visible):
        entry = visible[n]
        return int(entry) if entry.isdigit() else entry
    return n


class NvmlUtilization:
    """GPU utilization from NVML (`nvidia-ml-py`). `device` is a torch-style index or "cuda:N".

    Construction raises ConfigError naming the cause when NVML or the device is unavailable; a read
    that fails later (driver hiccup, device lost) returns None so the controller simply holds.
    """

    def __init__(self, device: str | int = 0) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise ConfigError(f"NVML is unavailable (no NVIDIA driver?): {exc}") from exc
        self._nvml: Any = pynvml
        target = _nvml_index(device)
        try:
            if isinstance(target, int):
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(target)
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(target)
        except Exception as exc:
            pynvml.nvmlShutdown()
            raise ConfigError(f"NVML has no device {target!r}: {exc}", param="device") from exc
        self.device = target
        self._closed = False

    def read(self) -> float | None:
        if self._closed:
            return None
        try:
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
        except Exception:  # NVMLError: report "no data" rather than failing the engine loop
            return None
        return _clean(rates.gpu / 100.0)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._nvml.nvmlShutdown()


def make_utilization_source(
    device: str, busy_fraction: Callable[[], float | None]
) -> UtilizationSource:
    """NVML on a CUDA device when NVML works, else the engine's busy fraction."""
    if device.startswith("cuda"):
        try:
            return NvmlUtilization(device)
        except ConfigError:
            pass
    return BusyFractionSource(busy_fraction)
