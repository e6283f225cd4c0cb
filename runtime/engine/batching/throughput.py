"""The batch controller's input: the share of the device's saturation throughput being delivered.

    u = busy fraction x (1 - a / T(work of the window's mean batch))

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
from runtime.engine.batching.utilization import BusyTracker, Demand
from runtime.engine.stats import StepStats


@dataclass(frozen=True)
class ThroughputReading:
    """One evaluation of the signal and its parts (None: no data)."""

    utilization: float | None  # u, the controller's input and fastllm_device_utilization_ratio
    busy_fraction: float | None  # share of the window spent in execute()
    saturation_share: float | None  # 1 - a / T at the window's mean work
    num_steps: int  # steps that ended in the window
    binding_fraction: float  # share of them at which the limit held requests back
    num_seqs: int | None  # sequences in the window's latest step
    fit: StepTimeFit | None


class ThroughputUtilization:
    """A UtilizationSource fed with StepStats (`observe`). `busy` is the engine's own tracker when
    the engine records busy time itself; without one, observed steps fill a private tracker.

    The work the share is evaluated at is the window's mean batch (sequences per step) times the
    work per sequence of the last `mix_steps` steps (tokens, sampled rows, attention pairs per
    sequence: the prefill/decode mix and the context). A window of a few steps at a slow device
    would otherwise read high or low by whether a prefill burst fell into it; this way the reading
    follows the batch size at once and the mix smoothly.
    """

    def __init__(
        self,
        model: StepTimeModel | None = None,
        *,
        window_s: float = 1.0,
        busy: BusyTracker | None = None,
        clock: Callable[[], float] = time.monotonic,
        binding_share: float = 0.5,
        mix_steps: int = 64,
    ) -> None:
        self.model = model or StepTimeModel()
        self.window_s = window_s
        self.binding_share = binding_share
        self._clock = clock
        self._own_busy = busy is None
        self._busy = busy if busy is not None else BusyTracker(window_s, clock=clock)
        # (observed at, limit bound, sequences) of the window's steps
        self._window: deque[tuple[float, bool, int]] = deque()
        self._mix: deque[tuple[tuple[float, float, float], int]] = deque(maxlen=mix_steps)
        self._lock = threading.Lock()
        self._num_observed = 0
        self._last: tuple[int, ThroughputReading] | None = None  # for demand() right after read()

    def observe(self, step: StepStats) -> None:
        """Called by the engine after every step (its thread, outside the forward)."""
        cost = StepCost.of(step)
        self.model.observe(cost, step.busy_seconds)
        now = self._clock()
        if self._own_busy:
            self._busy.add_busy(step.busy_seconds, end=now)
        with self._lock:
            self._num_observed += 1
            self._window.append((now, step.limit_binds, step.num_seqs))
            if step.num_seqs > 0:
                self._mix.append((cost.features, step.num_seqs))
            self._prune(now)

    def _prune(self, now: float) -> None:
        while self._window and self._window[0][0] <= now - self.window_s:
            self._window.popleft()

    def _per_sequence(self) -> tuple[float, float, float]:
        num_seqs = sum(n for _, n in self._mix)
        return (
            sum(f[0] for f, _ in self._mix) / num_seqs,
            sum(f[1] for f, _ in self._mix) / num_seqs,
            sum(f[2] for f, _ in self._mix) / num_seqs,
        )

    def reading(self, now: float | None = None) -> ThroughputReading:
        now = self._clock() if now is None else now
        with self._lock:
            self._prune(now)
            steps = list(self._window)
            per_seq = self._per_sequence() if steps and self._mix else None
        fit = self.model.fit()
        busy = self._busy.fraction(now)
        binding = sum(s[1] for s in steps) / len(steps) if steps else 0.0
        share = None
        if fit is not None and per_seq is not None:
            batch = sum(s[2] for s in steps) / len(steps)
            work = (batch * per_seq[0], batch * per_seq[1], batch * per_seq[2])
            share = fit.saturation_share(work)
        u: float | None = None
        if fit is not None and busy is not None:  # an idle window delivers nothing: u = 0
            u = busy * share if share is not None else 0.0
        num_seqs = steps[-1][2] if steps else None
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
        return Demand(limit_binds=binds, num_seqs=reading.num_seqs)
