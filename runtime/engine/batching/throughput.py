"""The batch controller's input: the share of the device's saturation throughput being delivered.

    u = busy fraction x (1 - a / T(mean work of the window's steps))

over the trailing control window, with `T` and `a` from the online step-time model. Duty cycles
alone (the busy fraction, NVML `utilization.gpu`) read ~1 under any backlog whatever the batch,
so shrinking cannot lower them and a controller fed with them ratchets down to `min_num_seqs`;
`1 - a/T` rises with the batch, so the law settles where a bigger batch buys little throughput.

The window also says whether the limit binds: a step binds when, at schedule time, requests were
left waiting with the batch at the limit (`StepStats.limit_binds`). While fewer than half of the
window's steps bind, raising or lowering the limit changes nothing the engine does, so the
controller holds (idle periods and light open-loop load do not ratchet it anywhere).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from runtime.engine.batching.step_model import StepCost, StepTimeFit, StepTimeModel
from runtime.engine.batching.utilization import BusyTracker
from runtime.engine.stats import StepStats


@dataclass(frozen=True)
class ThroughputReading:
    """One evaluation of the signal and its parts (None: no data)."""

    utilization: float | None  # u, the controller's input and fastllm_device_utilization_ratio
    busy_fraction: float | None  # share of the window spent in execute()
    saturation_share: float | None  # 1 - a / T at the window's mean work
    num_steps: int  # steps that ended in the window
    binding_fraction: float  # share of them at which the limit held requests back
    fit: StepTimeFit | None


class ThroughputUtilization:
    """A UtilizationSource fed with StepStats (`observe`). `busy` is the engine's own tracker when
    the engine records busy time itself; without one, observed steps fill a private tracker."""

    def __init__(
        self,
        model: StepTimeModel | None = None,
        *,
        window_s: float = 1.0,
        busy: BusyTracker | None = None,
        clock: Callable[[], float] = time.monotonic,
        binding_share: float = 0.5,
    ) -> None:
        self.model = model or StepTimeModel()
        self.window_s = window_s
        self.binding_share = binding_share
        self._clock = clock
        self._own_busy = busy is None
        self._busy = busy if busy is not None else BusyTracker(window_s, clock=clock)
        self._steps: deque[tuple[float, tuple[float, float, float], bool]] = deque()
        self._lock = threading.Lock()

    def observe(self, step: StepStats) -> None:
        """Called by the engine after every step (its thread, outside the forward)."""
        cost = StepCost.of(step)
        self.model.observe(cost, step.busy_seconds)
        now = self._clock()
        if self._own_busy:
            self._busy.add_busy(step.busy_seconds, end=now)
        with self._lock:
            self._steps.append((now, cost.features, step.limit_binds))
            self._prune(now)

    def _prune(self, now: float) -> None:
        while self._steps and self._steps[0][0] <= now - self.window_s:
            self._steps.popleft()

    def reading(self, now: float | None = None) -> ThroughputReading:
        now = self._clock() if now is None else now
        with self._lock:
            self._prune(now)
            steps = list(self._steps)
        fit = self.model.fit()
        busy = self._busy.fraction(now)
        binding = sum(b for _, _, b in steps) / len(steps) if steps else 0.0
        share = None
        if fit is not None and steps:
            mean = tuple(sum(f[i] for _, f, _ in steps) / len(steps) for i in range(3))
            share = fit.saturation_share((mean[0], mean[1], mean[2]))
        if fit is None or busy is None:
            u = None
        else:  # an idle window delivers nothing: u = 0 (busy is 0 too)
            u = busy * share if share is not None else 0.0
        return ThroughputReading(u, busy, share, len(steps), binding, fit)

    def read(self) -> float | None:
        return self.reading().utilization

    def limit_binds(self) -> bool:
        """Whether the batch limit held requests back in most of the window's steps."""
        reading = self.reading()
        return reading.num_steps > 0 and reading.binding_fraction >= self.binding_share
