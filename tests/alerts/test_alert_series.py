"""The evaluator writes Prometheus' ALERTS series into its own store, so queries over alert
states (the Alerts dashboard, the status page) read the same series as from a Prometheus: one
series per active alert and state, a staleness marker when it leaves that state."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from alerts.evaluator import AlertEvaluator, EvaluatorConfig
from alerts.promql import Evaluator, parse
from alerts.sources import RegistrySource

T0 = 1_700_000_000.0
ALERT = "FastllmDeviceUtilizationLow"  # u < 0.5 for 5m


def _query(evaluator: AlertEvaluator, text: str, t: float) -> list[tuple[dict[str, str], float]]:
    value = Evaluator(evaluator.store).instant(parse(text), t)
    assert isinstance(value, list)
    return sorted((dict(s.labels), s.value) for s in value)


def test_alerts_series_follow_pending_firing_resolved() -> None:
    registry = CollectorRegistry()
    gauge = Gauge("fastllm_device_utilization_ratio", "u", ["device"], registry=registry)
    evaluator = AlertEvaluator(EvaluatorConfig(), RegistrySource(registry, instance="rt:8000"))
    util = gauge.labels(device="cpu")
    util.set(0.3)
    for t in range(0, 301, 15):  # pending from 0 s, firing at 300 s
        evaluator.tick(T0 + t)
    assert evaluator.settled_ts == T0 + 300
    [(labels, value)] = _query(evaluator, f'ALERTS{{alertname="{ALERT}"}}', T0 + 300)
    assert value == 1.0
    assert labels == {
        "__name__": "ALERTS",
        "alertname": ALERT,
        "alertstate": "firing",
        "device": "cpu",
        "instance": "rt:8000",
        "job": "fastllm",
        "severity": "warning",
    }
    # the pending series went stale the moment the alert fired, as in Prometheus
    assert _query(evaluator, 'ALERTS{alertstate="pending"}', T0 + 300) == []
    assert _query(evaluator, 'ALERTS{alertstate="pending"}', T0 + 285)[0][1] == 1.0
    # the status page's counting stats
    firing = 'count(ALERTS{alertstate="firing"}) or vector(0)'
    assert _query(evaluator, firing, T0 + 300) == [({}, 1.0)]
    util.set(0.75)
    evaluator.tick(T0 + 315)  # resolved: no ALERTS series at all
    assert _query(evaluator, "ALERTS", T0 + 315) == []
    assert _query(evaluator, firing, T0 + 315) == [({}, 0.0)]
    states = [(tr.alert.name, tr.state) for tr in evaluator.recent]
    assert states == [(ALERT, "pending"), (ALERT, "firing"), (ALERT, "resolved")]
