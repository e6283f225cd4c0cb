"""Alert states (from the embedded evaluator) and the operator-anomaly audit (the same
`storage.run_audit` query as `fastllm audit`) for the status page."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from alerts.state import FIRING, PENDING
from runtime.server.state import ServerState

log = logging.getLogger("fastllm.server")
NUM_WORST = 10
NUM_CHANGES = 20


@dataclass(frozen=True)
class ActiveAlert:
    state: str  # pending | firing
    labels: dict[str, str]
    summary: str
    description: str
    runbook_url: str
    value: float
    active_at: float  # unix seconds: when it turned pending
    fired_at: float | None


@dataclass(frozen=True)
class RuleStatus:
    name: str
    severity: str
    state: str  # inactive | pending | firing (the worst of its alerts)
    alerts: list[ActiveAlert] = field(default_factory=list)


@dataclass(frozen=True)
class Change:
    """One alert state transition, newest last."""

    alertname: str
    state: str  # pending | firing | resolved
    ts: float
    labels: dict[str, str]


@dataclass(frozen=True)
class AlertsInfo:
    enabled: bool  # the embedded evaluator runs (alerts_enabled)
    time_scale: float
    rules: list[RuleStatus] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)  # within the page's window


@dataclass(frozen=True)
class AuditInfo:
    available: bool
    reason: str | None  # why not, when not
    threshold: float | None = None  # the base; each verified row is checked against its own
    since: str | None = None  # ISO time: the page's window
    num_anomalies: int = 0
    per_op: list[dict[str, Any]] = field(default_factory=list)
    # the worst rows name requests: only for the admin (None otherwise)
    worst: list[dict[str, Any]] | None = None
    # whose rows: this server's served models on this instance, unless the page asked for all
    # (servers sharing one database, e.g. the default SQLite file, write into one table)
    models: list[str] = field(default_factory=list)  # empty: every model
    instance: str | None = None  # None: every server
    per_row: bool = True  # rows against their recorded tolerance (`threshold` where none)


def alerts_info(state: ServerState, window_s: float) -> AlertsInfo:
    evaluator = state.alerts
    if evaluator is None:
        return AlertsInfo(enabled=False, time_scale=state.settings.alerts_time_scale)
    rules = []
    for rule_state in evaluator.manager.states:
        rule = rule_state.rule
        active = sorted(rule_state.active((PENDING, FIRING)), key=lambda a: a.active_at)
        worst = FIRING if any(a.state == FIRING for a in active) else PENDING if active else None
        severity = rule.labels.get("severity")
        rules.append(
            RuleStatus(
                name=rule.name,
                severity=severity.source if severity is not None else "",
                state=worst or "inactive",
                alerts=[
                    ActiveAlert(
                        state=a.state,
                        labels=dict(a.labels),
                        summary=a.annotations.get("summary", ""),
                        description=a.annotations.get("description", ""),
                        runbook_url=a.annotations.get("runbook_url", ""),
                        value=a.value,
                        active_at=a.active_at,
                        fired_at=a.fired_at,
                    )
                    for a in active
                ],
            )
        )
    since = time.time() - window_s
    changes = [
        Change(t.alert.name, t.state, t.ts, dict(t.alert.labels))
        for t in evaluator.recent.copy()
        if t.ts >= since
    ]
    return AlertsInfo(True, evaluator.config.time_scale, rules, changes[-NUM_CHANGES:])


def audit_info(
    state: ServerState, window_s: float, *, is_admin: bool, every_server: bool = False
) -> AuditInfo:
    """Per op over the page's window, this server's rows (`every_server`: every row); blocking
    (a SQL query): run it off the event loop."""
    if state.writer is None:
        return AuditInfo(False, "storage is off (storage_enabled=false): no inference_log")
    from sqlalchemy.exc import SQLAlchemyError

    from storage.audit import anomaly_threshold, run_audit
    from storage.rows import server_instance

    threshold = anomaly_threshold(state.settings)
    since = datetime.now(timezone.utc) - timedelta(seconds=window_s)
    models = () if every_server else tuple(sorted({m for m, _, _ in state.router.engines()}))
    instance = None if every_server else server_instance(state.settings)
    try:
        report = run_audit(
            state.writer.engine,
            threshold,
            since=since,
            num_worst=NUM_WORST,
            per_row=True,
            models=models,
            instance=instance,
        )
    except SQLAlchemyError as exc:  # not migrated yet, database down: say so, do not fail
        log.warning("status page audit failed: %s", exc)
        return AuditInfo(False, f"the audit query failed: {type(exc).__name__}")
    data = report.to_json()
    return AuditInfo(
        available=True,
        reason=None,
        threshold=threshold,
        since=data["since"],
        num_anomalies=report.num_anomalies,
        per_op=data["per_op"],
        worst=data["worst"] if is_admin else None,
        models=list(models),
        instance=instance,
    )
