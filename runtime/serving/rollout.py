"""Canary rollout: change the canary's weight, promote it, roll it back, and roll it back
automatically when it does worse than the stable version.

`RolloutController` is a StatsSink on the engines' FanOut: every finished request and every
verification probe lands in a sliding window per (model, version). After each record it compares
the canary with the stable version of the same model: when the canary's error rate (internal
failures and timeouts among requests that ran) or operator-anomaly rate (verified results whose
|output - expected| exceeds the threshold) is above the stable version's by more than the policy's
margin, with enough requests on the canary to judge, the canary's weight drops to 0 and listeners
get a `RolloutEvent` (the server turns it into a metric and an alert_events row).

Requests already routed to a version finish there: weight changes only steer new requests, and a
promoted-away engine keeps running what it holds (the caller drains it).

Across replicas (runtime/serving/rollout_sync.py) a replica `adopt`s a peer's event when it is
newer than its own last one and is about the same versions: newest event wins, with the peer's
timestamp kept, so the replicas converge and never bounce an event back.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from runtime.engine.stats import (
    FailureReason,
    FinishReason,
    RequestStats,
    StepStats,
    VerificationResult,
)
from runtime.serving.router import Router

# failures of the version itself, not of the client
ERROR_REASONS = (FailureReason.INTERNAL, FailureReason.TIMEOUT)
JUDGED = (FinishReason.STOP, FinishReason.LENGTH, *ERROR_REASONS)
log = logging.getLogger("fastllm.rollout")  # requests that ran (not refused, not cancelled)
WINDOW_BUCKETS = 300  # a window's time buckets: 1 s each on the default 300 s window


@dataclass(frozen=True)
class RolloutPolicy:
    window_s: float = 300.0
    min_requests: int = 20  # canary requests in the window before the error rate is judged
    min_verified: int = 5  # canary probes in the window before the anomaly rate is judged
    max_error_rate_delta: float = 0.05
    max_anomaly_rate_delta: float = 0.05
    anomaly_threshold: float = 1e-3  # |output - expected| above this is an anomaly
    auto_rollback: bool = True


@dataclass(frozen=True)
class VersionHealth:
    version: str
    num_requests: int
    num_errors: int
    num_verified: int
    num_anomalies: int

    @property
    def error_rate(self) -> float:
        return self.num_errors / self.num_requests if self.num_requests else 0.0

    @property
    def anomaly_rate(self) -> float:
        return self.num_anomalies / self.num_verified if self.num_verified else 0.0


@dataclass(frozen=True)
class RolloutEvent:
    model: str
    action: str  # "set_weight" | "promote" | "rollback"
    stable: str  # version names after the action
    canary: str | None
    canary_weight: float
    reason: str  # "operator", or for an automatic rollback "error_rate" | "anomaly_rate"
    automatic: bool = False
    detail: str = ""
    delta: float | None = None  # canary rate minus stable rate that triggered a rollback
    ts: float = field(default_factory=time.time)
    retired: Any = None  # promote: the engine no longer routed (the caller drains it)
    origin: str = ""  # "" when decided here; else the replica (URL) it was adopted from


class _Window:
    """Events and flagged events of the last `window_s` seconds, counted in time buckets of
    `window_s / WINDOW_BUCKETS` seconds: an event counts for `window_s` seconds plus at most one
    bucket's width. Its size is bounded by the window, not by the request rate: every finished
    request lands in one, and with no canary on the model nothing else ever reads (and so prunes)
    it, which held a (timestamp, flag) pair per request for the life of the server (~90 bytes a
    request: the 100,000-request soak's RSS slope, issue 39)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.width = window_s / WINDOW_BUCKETS
        self.buckets: deque[list[int]] = deque()  # [bucket index, events, flagged], oldest first

    def add(self, ts: float, flag: bool) -> None:
        index = math.floor(ts / self.width)
        if self.buckets and index <= self.buckets[-1][0]:  # the same one (or the clock went back)
            bucket = self.buckets[-1]
        else:
            bucket = [index, 0, 0]
            self.buckets.append(bucket)
            self._prune(ts - self.window_s)
        bucket[1] += 1
        bucket[2] += flag

    def counts(self, since: float) -> tuple[int, int]:
        self._prune(since)
        return sum(b[1] for b in self.buckets), sum(b[2] for b in self.buckets)

    def __len__(self) -> int:
        return len(self.buckets)

    def _prune(self, since: float) -> None:
        """Drop the buckets that end at or before `since` (the one holding `since` stays)."""
        first = math.floor(since / self.width)
        while self.buckets and self.buckets[0][0] < first:
            self.buckets.popleft()


class RolloutController:
    def __init__(
        self,
        router: Router,
        policy: RolloutPolicy = RolloutPolicy(),
        *,
        listeners: Sequence[Callable[[RolloutEvent], None]] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.router = router
        self.policy = policy
        self.listeners = list(listeners)
        self.clock = clock
        self.last_events: dict[str, RolloutEvent] = {}
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str], _Window] = {}
        self._probes: dict[tuple[str, str], _Window] = {}

    # --- StatsSink -------------------------------------------------------------------------------
    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None:
        models: set[str] = set()
        now = self.clock()
        with self._lock:
            for stats in finished:
                if stats.status in JUDGED:
                    key = (stats.model, stats.version)
                    self._window(self._requests, key).add(
                        now, stats.failure_reason in ERROR_REASONS
                    )
                    models.add(stats.model)
            for result in verified:
                is_anomaly = result.is_anomaly(self.policy.anomaly_threshold)  # NaN counts
                key = (result.model, result.version)
                self._window(self._probes, key).add(now, is_anomaly)
                models.add(result.model)
        if self.policy.auto_rollback:
            for model in models:
                self.check(model)

    def _window(self, windows: dict[tuple[str, str], _Window], key: tuple[str, str]) -> _Window:
        window = windows.get(key)
        if window is None:
            window = windows[key] = _Window(self.policy.window_s)
        return window

    def window_lengths(self) -> dict[str, int]:
        """Buckets held per window ("requests|probes model version"): each stays within
        WINDOW_BUCKETS + 1 however many requests finish."""
        with self._lock:
            return {
                f"{kind} {model} {version}": len(window)
                for kind, windows in (("requests", self._requests), ("probes", self._probes))
                for (model, version), window in windows.items()
            }

    @staticmethod
    def _counts(
        windows: dict[tuple[str, str], _Window], key: tuple[str, str], since: float
    ) -> tuple[int, int]:
        window = windows.get(key)
        return (0, 0) if window is None else window.counts(since)

    # --- health and the automatic decision -------------------------------------------------------
    def health(self, model: str, version: str) -> VersionHealth:
        since = self.clock() - self.policy.window_s
        with self._lock:
            requests, errors = self._counts(self._requests, (model, version), since)
            probes, anomalies = self._counts(self._probes, (model, version), since)
        return VersionHealth(version, requests, errors, probes, anomalies)

    def check(self, model: str) -> RolloutEvent | None:
        """Roll the canary of `model` back if it does worse than stable by more than a margin."""
        route = self.router.routes.get(model)
        if route is None or route.canary is None or route.canary_weight <= 0.0:
            return None
        canary = self.health(model, route.canary.name)
        stable = self.health(model, route.stable.name)
        p = self.policy
        verdicts = [
            (
                "error_rate",
                canary.num_requests >= p.min_requests,
                canary.error_rate - stable.error_rate,
                p.max_error_rate_delta,
            ),
            (
                "anomaly_rate",
                canary.num_verified >= p.min_verified,
                canary.anomaly_rate - stable.anomaly_rate,
                p.max_anomaly_rate_delta,
            ),
        ]
        for reason, enough, delta, margin in verdicts:
            if enough and delta > margin:
                detail = (
                    f"canary {route.canary.name} {reason.replace('_', ' ')} exceeds stable "
                    f"{route.stable.name}'s by {delta:.3f} (margin {margin:g}) over the last "
                    f"{p.window_s:g}s: canary {canary}, stable {stable}"
                )
                return self.rollback(
                    model, reason=reason, automatic=True, detail=detail, delta=delta
                )
        return None

    # --- operator actions ------------------------------------------------------------------------
    def set_weight(self, model: str, weight: float, *, reason: str = "operator") -> RolloutEvent:
        route = self.router.set_canary_weight(model, weight)
        return self._emit(RolloutEvent(model, "set_weight", *_names(route), reason=reason))

    def rollback(
        self,
        model: str,
        *,
        reason: str = "operator",
        automatic: bool = False,
        detail: str = "",
        delta: float | None = None,
    ) -> RolloutEvent:
        with self._lock:  # one rollback per breach, however many threads saw it
            route = self.router.route_of(model)
            was_live = route.canary is not None and route.canary_weight > 0.0
            if automatic and not was_live:
                return self.last_events[model]
            route = self.router.set_canary_weight(model, 0.0)
            if route.canary is not None:  # a later set_weight starts from a clean window
                self._requests.pop((model, route.canary.name), None)
                self._probes.pop((model, route.canary.name), None)
            event = RolloutEvent(
                model, "rollback", *_names(route), reason, automatic, detail, delta
            )
            self.last_events[model] = event
        return self._emit(event)

    def promote(self, model: str) -> RolloutEvent:
        retired = self.router.promote(model)
        route = self.router.route_of(model)
        event = RolloutEvent(model, "promote", *_names(route), reason="operator", retired=retired)
        return self._emit(event)

    def adopt(self, event: RolloutEvent) -> RolloutEvent | None:
        """Apply a peer's event if it is newer than this replica's last one for the model and is
        about the versions this replica routes (a promote: its canary is the peer's new stable;
        otherwise the same stable and canary). Returns the adopted event, or None."""
        with self._lock:
            route = self.router.routes.get(event.model)
            own = self.last_events.get(event.model)
            if route is None or route.canary is None or (own is not None and own.ts >= event.ts):
                return None
            retired = None
            if event.action == "promote":
                if route.canary.name != event.stable:
                    return None
                retired = self.router.promote(event.model)
            elif (route.stable.name, route.canary.name) == (event.stable, event.canary):
                self.router.set_canary_weight(event.model, event.canary_weight)
                if event.action == "rollback":  # as a local rollback: a clean window after
                    self._requests.pop((event.model, route.canary.name), None)
                    self._probes.pop((event.model, route.canary.name), None)
            else:
                return None
            adopted = replace(event, retired=retired)
            self.last_events[event.model] = adopted
        return self._emit(adopted)

    def _emit(self, event: RolloutEvent) -> RolloutEvent:
        self.last_events[event.model] = event
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:  # a failing sink must not undo or block the rollout action
                log.exception("rollout listener %r failed", listener)
        return event


def _names(route: Any) -> tuple[str, str | None, float]:
    return route.stable.name, route.canary.name if route.canary else None, route.canary_weight
