"""The embedded alert evaluator: every interval it samples the runtime's metrics into a sample
store, evaluates the rule file (the same YAML Prometheus loads) with pending -> firing ->
resolved semantics, records transitions and hands notifications to background notifiers.

`tick(now)` is one round and takes the time as an argument, so tests drive it with a virtual
clock; `start()` schedules `tick` on the process's APScheduler BackgroundScheduler.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from alerts.alert_series import AlertSeries
from alerts.events import EventSink, MemoryEvents
from alerts.manager import RuleManager
from alerts.notifiers import Background, Notification
from alerts.outage import OutageLog
from alerts.promql import LOOKBACK_S
from alerts.rules import load_rules
from alerts.scheduler import get_scheduler
from alerts.sources import MetricSource, Sampler
from alerts.state import FIRING, PENDING, Transition
from alerts.store import MemorySampleStore, SampleStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvaluatorConfig:
    interval_s: float = 15.0  # sampling + evaluation period (Prometheus' evaluation_interval)
    rules_path: Path | None = None  # None: alerts/rules/fastllm.rules.yml
    time_scale: float = 1.0  # multiplies every for:, range, offset and the lookback
    resend_interval_s: float = 60.0  # re-notify firing alerts this often (Prometheus: 1m)
    external_url: str = "http://127.0.0.1:8000"  # base of the alerts' generatorURL
    job: str = "fastllm"  # the `job` label of sampled series
    # metrics sampled beside those the rules read (the status page's panels), and how long the
    # store keeps them at least (seconds, real time); the rules alone keep ~1.5x their widest window
    extra_names: frozenset[str] = frozenset()
    min_retention_s: float = 0.0

    @classmethod
    def from_settings(cls, settings: Any) -> EvaluatorConfig:
        return cls(
            interval_s=settings.alerts_interval_s,
            rules_path=settings.alerts_rules_path,
            time_scale=settings.alerts_time_scale,
            external_url=f"http://{settings.host}:{settings.port}",
        )


class AlertEvaluator:
    def __init__(
        self,
        config: EvaluatorConfig,
        source: MetricSource,
        *,
        store: SampleStore | None = None,
        notifiers: Sequence[Background] = (),
        events: EventSink | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.groups = load_rules(config.rules_path, time_scale=config.time_scale)
        self.store = store if store is not None else MemorySampleStore()
        self.manager = RuleManager(self.groups, self.store)
        self.sampler = Sampler(source, self.store, names=self._names(), job=config.job)
        self.notifiers = list(notifiers)
        self.events = events if events is not None else MemoryEvents()
        self.clock = clock
        self.expr_of = {s.rule.name: s.rule.expr_text for s in self.manager.states}
        # keep what the widest window plus the lookback can still reach, with a margin
        self.retention_s = max(
            (self.manager.max_window_s + LOOKBACK_S * config.time_scale) * 1.5,
            config.min_retention_s,
        )
        self.alert_series = AlertSeries()
        # the newest round fully in the store: results at earlier times can no longer change
        self.settled_ts: float | None = None
        self.recent: deque[Transition] = deque(maxlen=256)  # newest transitions (status page)
        self._last_sent: float | None = None
        self._job_id: str | None = None
        self.outage = OutageLog(log, "alert evaluation")  # e.g. the database unreachable
        self.events_outage = OutageLog(log, "recording alert events")

    def _names(self) -> set[str] | None:
        names = self.manager.metric_names
        return None if names is None else names | {"up"} | self.config.extra_names

    def tick(self, now: float | None = None) -> list[Transition]:
        """Sample, evaluate, record, notify; returns this round's transitions."""
        t = round(self.clock() if now is None else now, 3)
        self.sampler.sample(t)
        transitions = self.manager.evaluate(t)
        # as Prometheus: the ALERTS series of this round, stamped with the evaluation time
        self.store.append(t, self.alert_series.points(self.manager.alerts((PENDING, FIRING))))
        self.settled_ts = t
        self.recent.extend(transitions)
        if transitions:
            try:
                self.events.record(transitions)
            except Exception as exc:
                self.events_outage.failed(exc)
            else:
                self.events_outage.ok()
        self._notify(t, changed=any(tr.state != "pending" for tr in transitions))
        self.store.prune(t - self.retention_s)
        return transitions

    def _notify(self, t: float, *, changed: bool) -> None:
        due = self._last_sent is None or t - self._last_sent >= self.config.resend_interval_s
        alerts = self.manager.notifiable()
        if not alerts or not (changed or due):
            return
        notification = Notification(alerts, t, self.expr_of)
        for notifier in self.notifiers:
            notifier.submit(notification)
        self._last_sent = t

    def _safe_tick(self) -> None:
        try:
            self.tick()
        except Exception as exc:  # a scheduler job must never die silently, nor flood the log
            self.outage.failed(exc)
        else:
            self.outage.ok()

    def start(self) -> None:
        """Run `tick` every interval on the process's BackgroundScheduler."""
        if self._job_id is not None:
            return
        self._job_id = f"alerts-{uuid.uuid4().hex[:8]}"
        get_scheduler().add_job(
            self._safe_tick,
            "interval",
            seconds=self.config.interval_s,
            id=self._job_id,
            next_run_time=datetime.now(timezone.utc),  # first round at once
        )
        log.info(
            "alert evaluator started: %d rules every %gs",
            len(self.manager.states),
            self.config.interval_s,
        )

    def stop(self) -> None:
        if self._job_id is not None:
            with contextlib.suppress(Exception):
                get_scheduler().remove_job(self._job_id)
            self._job_id = None
        for notifier in self.notifiers:
            notifier.close()

    @property
    def is_running(self) -> bool:
        return self._job_id is not None
