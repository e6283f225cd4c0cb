"""Adaptive batch policy: a controller that owns the batch-size limit (sequences per engine step).

Control law, evaluated once per control interval from one utilization reading u:

    u < min_util  ->  grow:   limit = max(limit + 1, round(limit * (1 + step_up)))    (+20%)
    u > max_util  ->  shrink: limit = min(limit - 1, round(limit * (1 - step_down)))  (-10%)
    otherwise     ->  hold;   u = None (no data) -> hold
    limit is then clamped to [min_batch, max_batch].

Growing faster than shrinking finds headroom quickly and backs off gently. u is the share of the
device's saturation throughput the engine delivers (runtime.engine.batching.throughput): it rises
with the batch, so the limit settles at the knee of the throughput curve. A source that also gives
the demand (`DemandSignal`) makes the controller hold
- while the limit does not bind ("idle"): nothing waits for a place in the batch, so changing the
  limit would change nothing but the limit (idle periods do not ratchet it to the maximum);
- instead of shrinking while the batch in flight is still above the limit ("draining"): running
  sequences are never evicted, so a shrink takes effect only as they finish, and shrinking again
  meanwhile would ratchet the limit down without the batch following.
It also grows past the band ("queue") when the limit binds and the head of the queue has waited
longer than `max_queue_wait_s` (0: off): on the balanced band 32 closed-loop streams on a 2-core
CPU waited 12.5-13.7 s for a first token while the batch was held at the knee for short steps.
Such a grow makes room for every request then waiting (at least +step_up, at most max_batch).
`set_batch_policy(min_util, max_util, step_size)` sets the band and BOTH step sizes to
`step_size` (the DESIGN.md call passes a single step); it is applied at the next evaluation,
never between two.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from runtime.engine.batching.step_model import StepTimeModel
from runtime.engine.batching.throughput import ThroughputUtilization
from runtime.engine.batching.utilization import (
    BusyFractionSource,
    BusyTracker,
    Demand,
    DemandSignal,
    FakeUtilization,
    UtilizationSource,
)
from runtime.engine.stats import StepStats
from runtime.errors import ConfigError, InvalidRequestError

__all__ = [
    "AdaptiveBatchController",
    "BatchControllerStats",
    "BatchDecision",
    "BatchPolicyConfig",
    "BusyFractionSource",
    "BusyTracker",
    "Demand",
    "DemandSignal",
    "FakeUtilization",
    "StepObserver",
    "StepTimeModel",
    "ThroughputUtilization",
    "UtilizationSource",
    "next_limit",
]


@runtime_checkable
class StepObserver(Protocol):
    def observe(self, step: StepStats) -> None: ...


def _check_band(
    min_util: float, max_util: float, err: type[ConfigError | InvalidRequestError]
) -> None:
    if not 0.0 <= min_util < max_util <= 1.0:
        raise err(
            f"need 0 <= min_util < max_util <= 1, got {min_util}, {max_util}", param="min_util"
        )


def _check_step(name: str, value: float, err: type[ConfigError | InvalidRequestError]) -> None:
    if not 0.0 < value <= 1.0:
        raise err(f"{name} must be in (0, 1], got {value}", param=name)


@dataclass(frozen=True)
class BatchPolicyConfig:
    min_util: float = 0.6  # below: grow
    max_util: float = 0.8  # above: shrink
    step_up: float = 0.2  # relative growth per interval
    step_down: float = 0.1  # relative shrink per interval
    min_batch: int = 1
    max_batch: int = 64
    initial: int = 16
    interval_s: float = 1.0  # control interval (seconds on the caller's clock)
    # with the limit binding, the head of the queue waiting longer than this grows the limit
    # whatever u says (0: off): the band must not buy short steps with a long first token
    max_queue_wait_s: float = 0.0

    def __post_init__(self) -> None:
        _check_band(self.min_util, self.max_util, ConfigError)
        _check_step("step_up", self.step_up, ConfigError)
        _check_step("step_down", self.step_down, ConfigError)
        if not 1 <= self.min_batch <= self.initial <= self.max_batch:
            raise ConfigError(
                "need 1 <= min_batch <= initial <= max_batch, got "
                f"{self.min_batch}, {self.initial}, {self.max_batch}",
                param="initial",
            )
        if not self.interval_s > 0:
            raise ConfigError(f"interval_s must be > 0, got {self.interval_s}", param="interval_s")
        if not self.max_queue_wait_s >= 0:
            raise ConfigError(
                f"max_queue_wait_s must be >= 0, got {self.max_queue_wait_s}",
                param="max_queue_wait_s",
            )

    @classmethod
    def from_settings(cls, settings: Any, *, max_batch: int | None = None) -> BatchPolicyConfig:
        """From runtime.config.Settings (or anything with its field names, e.g. EngineConfig).
        `max_batch` overrides `max_num_seqs` (the engine caps it by its token budget); the lower
        bound and `initial_num_seqs` are clamped into the bounds so that lowering only the upper
        bound (say to 8) does not trip over the default initial of 16."""
        hi = settings.max_num_seqs if max_batch is None else max_batch
        lo = min(settings.min_num_seqs, hi)
        return cls(
            min_util=settings.min_util,
            max_util=settings.max_util,
            step_up=settings.step_up,
            step_down=settings.step_down,
            min_batch=lo,
            max_batch=hi,
            initial=min(hi, max(lo, settings.initial_num_seqs)),
            interval_s=settings.control_interval_s,
            max_queue_wait_s=settings.max_queue_wait_s,
        )


def _grown(limit: int, config: BatchPolicyConfig) -> int:
    return max(limit + 1, int(limit * (1 + config.step_up) + 0.5))


def next_limit(limit: int, utilization: float | None, config: BatchPolicyConfig) -> tuple[int, str]:
    """The control law as a pure function: (new limit, action), action one of grow | shrink | hold |
    no_data | bound (the law asked for a change but the limit already sits at that bound)."""
    if utilization is None:
        return limit, "no_data"
    if utilization < config.min_util:
        proposed, action = _grown(limit, config), "grow"
    elif utilization > config.max_util:
        proposed, action = min(limit - 1, int(limit * (1 - config.step_down) + 0.5)), "shrink"
    else:
        return limit, "hold"
    new = min(config.max_batch, max(config.min_batch, proposed))
    return new, action if new != limit else "bound"


@dataclass(frozen=True)
class BatchDecision:
    """One evaluation of the control law."""

    ts: float  # the `now` passed to maybe_update (caller's clock)
    utilization: float | None
    old_limit: int
    new_limit: int
    action: str  # grow | shrink | hold | no_data | bound | idle | draining | queue (module doc)


@dataclass(frozen=True)
class BatchControllerStats:
    limit: int
    config: BatchPolicyConfig
    num_updates: int
    num_grows: int
    num_shrinks: int
    num_holds: int  # hold + bound
    num_no_data: int
    num_idle: int  # held because the limit did not bind
    num_draining: int  # held a shrink while the batch was still above the limit
    num_queue_grows: int  # grew past the band: the queue's head had waited over max_queue_wait_s
    last_utilization: float | None
    recent: tuple[BatchDecision, ...]  # newest last


class AdaptiveBatchController:
    """Owns the batch-size limit. Thread-safe: the engine loop reads `limit`, the engine's stats
    thread calls `observe` and `maybe_update` after each step (runtime.engine.core), an admin
    endpoint calls `set_batch_policy` from another thread."""

    def __init__(
        self,
        config: BatchPolicyConfig | None = None,
        source: UtilizationSource | None = None,
        *,
        demand: DemandSignal | None = None,
        clock: Callable[[], float] = time.monotonic,
        history: int = 256,
    ) -> None:
        """`demand`: whether the limit binds; default: the source itself when it can tell."""
        self._config = config or BatchPolicyConfig()
        self._source: UtilizationSource = source or FakeUtilization(None)
        if demand is None and isinstance(self._source, DemandSignal):
            demand = self._source
        self._demand = demand
        # checked once: a runtime protocol check costs more than the rest of a step's bookkeeping
        self._observer = self._source if isinstance(self._source, StepObserver) else None
        self._clock = clock
        # the limit in force: a plain attribute the engine loop reads each round without a
        # call (one int, replaced whole under the lock by an evaluation)
        self.limit = self._config.initial
        self._next_eval: float | None = None  # set by the first maybe_update: a full interval first
        self._lock = threading.Lock()
        self._recent: deque[BatchDecision] = deque(maxlen=history)
        actions = ("grow", "shrink", "hold", "bound", "no_data", "idle", "draining", "queue")
        self._counts = dict.fromkeys(actions, 0)
        self._last_util: float | None = None

    @classmethod
    def from_settings(
        cls, settings: Any, source: UtilizationSource | None = None, **kwargs: Any
    ) -> AdaptiveBatchController:
        return cls(BatchPolicyConfig.from_settings(settings), source, **kwargs)

    @property
    def config(self) -> BatchPolicyConfig:
        return self._config

    @property
    def source(self) -> UtilizationSource:
        return self._source

    def maybe_update(self, now: float | None = None) -> int:
        """Evaluate the law if a control interval has passed since the last evaluation (the first
        call only starts the clock). Cheap enough to call every engine step. Returns the limit."""
        now = self._clock() if now is None else now
        with self._lock:
            if self._next_eval is None:
                self._next_eval = now + self._config.interval_s
                return self.limit
            if now < self._next_eval:
                return self.limit
            # after a stall, restart from now instead of firing a burst of catch-up evaluations
            self._next_eval += self._config.interval_s
            if self._next_eval <= now:
                self._next_eval = now + self._config.interval_s
        return self.update(now)

    def update(self, now: float | None = None) -> int:
        """Evaluate the law once, right now (tests and manual control)."""
        now = self._clock() if now is None else now
        utilization = self._source.read()  # outside the lock: a source may take a moment
        demand = self._demand.demand() if self._demand is not None else None
        with self._lock:
            old, config = self.limit, self._config
            new, action = next_limit(old, utilization, config)
            if utilization is not None and demand is not None and not demand.limit_binds:
                action = "idle"
            elif (
                action in ("grow", "hold", "shrink", "bound")
                and demand is not None
                and config.max_queue_wait_s > 0
                and (demand.queue_wait_s or 0.0) > config.max_queue_wait_s
            ):
                # requests wait longer than the policy allows for a place the engine could give:
                # a first token matters more than the band's shorter steps. Room for all that
                # wait at once: a burst (32 requests on a limit of 16) would otherwise wait on
                # +20% a second, and in bench.serving spent its first seconds at half the batch
                grown = max(new, _grown(old, config), old + (demand.num_waiting or 0))
                grown = min(config.max_batch, grown)
                if action != "grow" or grown != new:  # a plain grow is still the band's
                    action = "queue" if grown != old else "bound"
                self.limit = grown
            elif action == "shrink" and demand is not None and (demand.num_seqs or 0) > old:
                action = "draining"
            else:
                self.limit = new
            self._counts[action] += 1
            self._last_util = utilization
            self._recent.append(BatchDecision(now, utilization, old, self.limit, action))
            return self.limit

    def observe(self, step: StepStats) -> None:
        """Every engine step's stats, for a source that learns from them (the step-time model)."""
        if self._observer is not None:
            self._observer.observe(step)

    def set_batch_policy(self, min_util: float, max_util: float, step_size: float) -> None:
        """Change the band and both step sizes at run time; used from the next evaluation on.
        Bad values raise InvalidRequestError (the admin endpoint answers 400)."""
        _check_band(min_util, max_util, InvalidRequestError)
        _check_step("step_size", step_size, InvalidRequestError)
        with self._lock:
            self._config = dataclasses.replace(
                self._config,
                min_util=min_util,
                max_util=max_util,
                step_up=step_size,
                step_down=step_size,
            )

    def stats(self) -> BatchControllerStats:
        with self._lock:
            c = self._counts
            return BatchControllerStats(
                limit=self.limit,
                config=self._config,
                num_updates=sum(c.values()),
                num_grows=c["grow"],
                num_shrinks=c["shrink"],
                num_holds=c["hold"] + c["bound"],
                num_no_data=c["no_data"],
                num_idle=c["idle"],
                num_draining=c["draining"],
                num_queue_grows=c["queue"],
                last_utilization=self._last_util,
                recent=tuple(self._recent),
            )
