"""Per-rule alert state, as Prometheus' AlertingRule.Eval: an expression result opens a pending
alert; it fires once it has been active for `for:`; it resolves when the expression no longer
returns it (a pending alert that disappears is simply dropped)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from alerts.errors import AlertRuleError
from alerts.fingerprint import fingerprint
from alerts.promql.types import METRIC_NAME, Labels, Vector
from alerts.rules import AlertRule

PENDING, FIRING, RESOLVED = "pending", "firing", "resolved"
# Prometheus keeps a resolved alert this long so that notifications of it repeat
RESOLVED_RETENTION_S = 15 * 60.0


@dataclass
class Alert:
    labels: dict[str, str]  # final labels: sample labels + rule labels + alertname
    annotations: dict[str, str]
    value: float
    state: str  # pending | firing | resolved
    active_at: float  # seconds since the epoch
    fired_at: float | None = None
    resolved_at: float | None = None
    fingerprint: str = field(default="")

    @property
    def name(self) -> str:
        return self.labels["alertname"]


@dataclass(frozen=True)
class Transition:
    """An alert entered `state` at `ts` (the snapshot is taken at that moment)."""

    state: str
    ts: float
    alert: Alert


class RuleState:
    def __init__(self, rule: AlertRule) -> None:
        self.rule = rule
        self.alerts: dict[str, Alert] = {}  # by fingerprint

    def evaluate(self, vector: Vector, t: float) -> list[Transition]:
        transitions: list[Transition] = []
        seen: set[str] = set()
        for sample in vector:
            labels, annotations = self._expand(sample.labels, sample.value)
            fp = fingerprint(labels)
            if fp in seen:
                raise AlertRuleError(
                    f"{self.rule.name}: several results share the label set {labels}"
                )
            seen.add(fp)
            alert = self.alerts.get(fp)
            if alert is not None and alert.state != RESOLVED:
                alert.value, alert.annotations = sample.value, annotations
                continue
            alert = Alert(labels, annotations, sample.value, PENDING, t, fingerprint=fp)
            self.alerts[fp] = alert
            transitions.append(Transition(PENDING, t, replace(alert)))
        for fp, alert in list(self.alerts.items()):
            if fp in seen:
                continue
            if alert.state == PENDING or (
                alert.resolved_at is not None and t - alert.resolved_at > RESOLVED_RETENTION_S
            ):
                del self.alerts[fp]
            elif alert.state == FIRING:
                alert.state, alert.resolved_at = RESOLVED, t
                transitions.append(Transition(RESOLVED, t, replace(alert)))
        for alert in self.alerts.values():
            if alert.state == PENDING and t - alert.active_at >= self.rule.for_s:
                alert.state, alert.fired_at = FIRING, t
                transitions.append(Transition(FIRING, t, replace(alert)))
        return transitions

    def _expand(self, sample_labels: Labels, value: float) -> tuple[dict[str, str], dict[str, str]]:
        template_labels = dict(sample_labels)
        labels = {k: v for k, v in sample_labels if k != METRIC_NAME}
        for key, template in self.rule.labels.items():
            labels[key] = template.render(template_labels, value)
        labels = {k: v for k, v in labels.items() if v != ""}
        labels["alertname"] = self.rule.name
        annotations = {
            key: template.render(template_labels, value)
            for key, template in self.rule.annotations.items()
        }
        return labels, annotations

    def active(self, states: tuple[str, ...] = (PENDING, FIRING)) -> list[Alert]:
        return [a for a in self.alerts.values() if a.state in states]
