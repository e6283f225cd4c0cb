"""The batch controller's input: the share of the device's saturation throughput being delivered.

    u = busy fraction x (throughput at the window's batch ÷ the best throughput at its mix)

over the trailing control window, throughput counted in sequences advanced per second (generated
tokens/s). Both come from the step-time model (runtime.engine.batching.step_model): the
throughput of the bucket at the window's batch size (the mean of its last ~32 steps, at their own
mix: measured) over the best throughput any batch delivered, moved to that mix. So u is ~1 at the
batch that saturates the device and lower by as much as a batch delivers less, whatever the shape
of the step-time curve. Duty cycles alone (the busy fraction, NVML `utilization.gpu`) read ~1
under any backlog whatever the batch, so shrinking cannot lower them and a controller fed with
them ratchets down to `min_num_seqs`; the share rises with the batch up to the knee, so the law
settles where a bigger batch buys little throughput.

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
from runtime.engine.batching.utilization import BusyTracker, Demand
from runtime.engine.stats import StepStats


@dataclass(frozen=True)
class _Observed:
    ts: float  # when the step was observed (the source's clock)
    binds: bool  # the limit held requests back at this step
    num_seqs: int
    features: tuple[float, float, float]  # tokens, sampled rows, attention pairs
    seconds: float  # the step's busy seconds
    has_more: bool  # sequences ran on or waited after it: the next step follows at once


@dataclass(frozen=True)
class ThroughputReading:
    """One evaluation of the signal and its parts (None: no data)."""

    utilization: float | None  # u, the controller's input and fastllm_device_utilization_ratio
    busy_fraction: float | None  # share of the window spent in execute()
    saturation_share: float | None  # the window's bucket's rows/s ÷ the best at its mix
    num_steps: int  # steps that ended in the window
    binding_fraction: float  # share of them at which the limit held requests back
    num_seqs: int | None  # sequences in the window's latest step
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
        recent_steps: int = 64,
    ) -> None:
        self.model = model or StepTimeModel()
        self.window_s = window_s
        self.binding_share = binding_share
        self._clock = clock
        self._own_busy = busy is None
        self._busy = busy if busy is not None else BusyTracker(window_s, clock=clock)
        self._window: deque[_Observed] = deque()
        self._recent: deque[_Observed] = deque(maxlen=recent_steps)  # the last steps that ran
        self._lock = threading.Lock()
        self._num_observed = 0
        self._last: tuple[int, ThroughputReading] | None = None  # for demand() right after read()
        self._queue_wait_s = 0.0  # the latest step's (0 when the limit did not bind)
        self._num_waiting = 0  # the latest step's

    def observe(self, step: StepStats) -> None:
        """Called by the engine after every step (its thread, outside the forward)."""
        cost = StepCost.of(step)
        self.model.observe(cost, step.busy_seconds)
        now = self._clock()
        if self._own_busy:
            self._busy.add_busy(step.busy_seconds, end=now)
        with self._lock:
            self._num_observed += 1
            self._queue_wait_s = step.queue_wait_s
            self._num_waiting = step.num_waiting
            more = step.num_running + step.num_waiting > 0
            seen = _Observed(
                now, step.limit_binds, step.num_seqs, cost.features, step.busy_seconds, more
            )
            self._window.append(seen)
            if step.num_seqs > 0:
                self._recent.append(seen)
            self._prune(now)

    def _prune(self, now: float) -> None:
        while self._window and self._window[0].ts <= now - self.window_s:
            self._window.popleft()

    def reading(self, now: float | None = None) -> ThroughputReading:
        now = self._clock() if now is None else now
        with self._lock:
            self._prune(now)
            steps = list(self._window)
            recent = list(self._recent)
        fit = self.model.fit()
        # busy time is recorded when a step ends: with work left after the last step, the time
        # since is a step in flight, not idle, so the busy share is read up to that step's end
        # (steps of 0.1 s would read ~5% low otherwise, and steps longer than the window 0)
        last = recent[-1] if recent else None
        in_flight = last is not None and last.has_more and now - last.ts < 10 * self.window_s
        busy = self._busy.fraction(last.ts if in_flight and last is not None else now)
        binding = sum(s.binds for s in steps) / len(steps) if steps else 0.0
        share = None
        working = bool(recent) and (bool(steps) or in_flight)
        if fit is not None and working:
            # the share of the bucket at the window's batch: its recent steps, at their own mix
            # (None while it has too few steps to say: the first step of a new size may be one
            # big prefill, and the controller holds rather than act on it)
            window = [s for s in steps or recent[-1:] if s.features[1] > 0] or recent[-1:]
            batch = sum(s.features[1] for s in window) / len(window)
            share = fit.share_of_bucket(StepTimeModel.bucket_of(max(1, round(batch))))
        u: float | None = None
        if fit is not None and busy is not None:
            if not working:  # an idle window delivers nothing: u = 0
                u = 0.0
            elif share is not None:
                u = busy * share
        num_seqs = steps[-1].num_seqs if steps else None
        return ThroughputReading(u, busy, share, len(steps), binding, num_seqs, fit)

    def read(self) -> float | None:
        with self._lock:
            seen = self._num_observed
        reading = self.reading()
        self._last = (seen, reading)
        return reading.utilization

    def demand(self) -> Demand:
        """The limit binds when it held requests back in most of the window's steps (the
        controller asks right after `read()`: that reading is reused if no step came between)."""
        last = self._last
        with self._lock:
            fresh = last is not None and last[0] == self._num_observed
        reading = last[1] if fresh and last is not None else self.reading()
        binds = reading.num_steps > 0 and reading.binding_fraction >= self.binding_share
        return Demand(
            limit_binds=binds,
            num_seqs=reading.num_seqs,
            queue_wait_s=self._queue_wait_s,
            num_waiting=self._num_waiting,
        )
