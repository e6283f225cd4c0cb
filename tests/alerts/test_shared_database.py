"""Finding 6 of issue 17: servers that share one database (SQLite file) each evaluate only the
instance they sample. A fresh server does not alert about stopped ones, and the series a previous
process of its own instance left behind go stale at its first round, as in Prometheus."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from alerts.embedded import build_evaluator
from alerts.evaluator import AlertEvaluator
from alerts.sources import RegistrySource
from runtime.config import load_settings
from storage.db import make_engine, upgrade
from storage.store import MetricStore

T0 = 1_700_000_000.0
DROPPING, HIGH = "FastllmInferenceLogDropping", "FastllmDeviceUtilizationHigh"


def _evaluator(db: Path, registry: CollectorRegistry, instance: str) -> AlertEvaluator:
    settings = load_settings(alerts_interval_s=15.0, storage_enabled=True)
    store = MetricStore(f"sqlite:///{db}")
    return build_evaluator(settings, RegistrySource(registry, instance), metric_store=store)


def _registry(*, dropped: float = 0.0) -> tuple[CollectorRegistry, Counter, Gauge]:
    registry = CollectorRegistry()
    counter = Counter("fastllm_inference_log_dropped", "d", ["reason"], registry=registry)
    counter.labels("queue_full").inc(dropped)
    gauge = Gauge("fastllm_device_utilization_ratio", "u", ["device"], registry=registry)
    return registry, counter, gauge


def _instances(evaluator: AlertEvaluator, name: str) -> set[str]:
    """Instances with a pending or firing `name` alert."""
    alerts = evaluator.manager.alerts(("pending", "firing"))
    return {a.labels["instance"] for a in alerts if a.labels["alertname"] == name}


def test_a_fresh_server_does_not_alert_about_stopped_ones(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    upgrade(make_engine(f"sqlite:///{db}"))
    stopped = []
    for instance in ("rt:8001", "rt:8002"):
        registry, counter, _ = _registry()
        evaluator = _evaluator(db, registry, instance)
        for k in range(8):
            counter.labels("queue_full").inc(5)  # dropping rows every round
            evaluator.tick(T0 + 15 * k)
        assert _instances(evaluator, DROPPING) == {instance}
        stopped.append(evaluator)
    registry, _, _ = _registry()
    fresh = _evaluator(db, registry, "rt:8003")
    for k in range(8, 12):  # within the 10m window of the stopped servers' increase
        fresh.tick(T0 + 15 * k)
        assert fresh.manager.alerts(("pending", "firing")) == []
    for evaluator in (*stopped, fresh):
        evaluator.stop()


def test_series_left_by_an_earlier_process_of_the_same_instance_go_stale(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    upgrade(make_engine(f"sqlite:///{db}"))
    registry, _, gauge = _registry()
    gauge.labels("cuda:0").set(0.95)
    before = _evaluator(db, registry, "rt:8000")
    for k in range(0, 21):  # 5 minutes above 90%: firing
        before.tick(T0 + 15 * k)
    assert _instances(before, HIGH) == {"rt:8000"}
    before.stop()

    registry, _, gauge = _registry()  # restarted on the same address, now on another device
    gauge.labels("cpu").set(0.75)
    after = _evaluator(db, registry, "rt:8000")
    after.tick(T0 + 15 * 22)  # 30 s later: the old series is still inside the 5m lookback
    assert _instances(after, HIGH) == set()  # not even pending
    gauge.labels("cpu").set(0.97)
    after.tick(T0 + 15 * 23)
    assert _instances(after, HIGH) == {"rt:8000"}  # its own series still count
    after.stop()
