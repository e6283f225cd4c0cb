"""The embedded evaluator on its own: a registry gauge held at 0.3, then 0.95, then 0.75 drives
the utilization alerts through pending -> firing -> resolved on a virtual clock; the same with
APScheduler's real clock and shortened windows; notifications and events on transitions."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Gauge

from alerts.evaluator import AlertEvaluator, EvaluatorConfig
from alerts.events import MemoryEvents
from alerts.notifiers import Background, Notification
from alerts.sources import RegistrySource

T0 = 1_700_000_000.0
LOW, HIGH = "FastllmDeviceUtilizationLow", "FastllmDeviceUtilizationHigh"


class _Capture:
    name = "capture"

    def __init__(self) -> None:
        self.notifications: list[Notification] = []

    def send(self, notification: Notification) -> None:
        self.notifications.append(notification)


def _setup(time_scale: float = 1.0, interval_s: float = 15.0):
    registry = CollectorRegistry()
    gauge = Gauge("fastllm_device_utilization_ratio", "u", ["device"], registry=registry)
    capture = _Capture()
    events = MemoryEvents()
    evaluator = AlertEvaluator(
        EvaluatorConfig(interval_s=interval_s, time_scale=time_scale),
        RegistrySource(registry, instance="127.0.0.1:8000"),
        notifiers=[Background(capture)],
        events=events,
    )
    return gauge.labels(device="cpu"), evaluator, events, capture


def test_utilization_alerts_follow_the_for_duration_on_a_virtual_clock() -> None:
    util, evaluator, events, capture = _setup()
    timeline: list[tuple[float, str, str]] = []

    def run(value: float, seconds: int) -> None:
        util.set(value)
        start = run.t  # type: ignore[attr-defined]
        for t in range(int(start), int(start) + seconds, 15):
            for tr in evaluator.tick(T0 + t):
                timeline.append((t, tr.alert.name, tr.state))
        run.t = start + seconds  # type: ignore[attr-defined]

    run.t = 0  # type: ignore[attr-defined]
    run(0.3, 600)  # 0..585s
    run(0.95, 600)  # 600..1185s
    run(0.75, 120)  # 1200..1305s
    assert timeline == [
        (0, LOW, "pending"),
        (300, LOW, "firing"),  # for: 5m, not a round earlier
        (600, LOW, "resolved"),
        (600, HIGH, "pending"),
        (900, HIGH, "firing"),
        (1200, HIGH, "resolved"),
    ]
    assert [(e.state, e.alert.name) for e in events.snapshot()] == [(s, n) for _, n, s in timeline]
    firing = [e for e in events.snapshot() if e.state == "firing"]
    assert firing[0].alert.labels == {
        "alertname": LOW,
        "severity": "warning",
        "device": "cpu",
        "instance": "127.0.0.1:8000",
        "job": "fastllm",
    }
    assert (
        firing[0].alert.annotations["description"].endswith("(now 30%); the target band is 70-80%.")
    )
    evaluator.stop()  # flushes the notifier queue
    # notified on every firing/resolved transition, with the alert's state at that moment
    states = [(a.name, a.state) for n in capture.notifications for a in n.alerts]
    assert (LOW, "firing") in states and (LOW, "resolved") in states
    assert (HIGH, "firing") in states and (HIGH, "resolved") in states
    assert all(a.state != "pending" for n in capture.notifications for a in n.alerts)


def test_staying_inside_the_band_fires_nothing() -> None:
    util, evaluator, events, _ = _setup()
    for i, value in enumerate([0.7, 0.75, 0.8, 0.72, 0.5, 0.9] * 20):
        util.set(value)
        evaluator.tick(T0 + 15 * i)
    evaluator.stop()
    assert [e for e in events.snapshot() if e.alert.name in (LOW, HIGH)] == []


def _wait(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_scheduled_on_apscheduler_with_shortened_windows() -> None:
    # time_scale 0.001: `for: 5m` is 0.3s, the 5m lookback 0.3s; evaluated every 50 ms
    util, evaluator, events, _ = _setup(time_scale=0.001, interval_s=0.05)

    def state_of(name: str) -> str | None:
        found = [e.state for e in events.snapshot() if e.alert.name == name]
        return found[-1] if found else None

    util.set(0.3)
    evaluator.start()
    try:
        assert evaluator.is_running
        _wait(lambda: state_of(LOW) == "firing")
        util.set(0.95)
        _wait(lambda: state_of(HIGH) == "firing")
        assert state_of(LOW) == "resolved"
        util.set(0.75)
        _wait(lambda: state_of(HIGH) == "resolved")
    finally:
        evaluator.stop()
    assert not evaluator.is_running
    sequence = [(e.alert.name, e.state) for e in events.snapshot()]
    assert sequence.index((LOW, "firing")) < sequence.index((HIGH, "pending"))


def test_a_vanished_series_is_stale_at_once() -> None:
    registry = CollectorRegistry()
    gauge = Gauge("fastllm_device_utilization_ratio", "u", ["device"], registry=registry)
    evaluator = AlertEvaluator(EvaluatorConfig(), RegistrySource(registry), events=MemoryEvents())
    gauge.labels(device="cpu").set(0.3)
    for t in range(0, 301, 15):
        evaluator.tick(T0 + t)
    assert [a.name for a in evaluator.manager.alerts()] == [LOW]
    gauge.remove("cpu")  # the device went away: a staleness marker, not 5 minutes of lookback
    evaluator.tick(T0 + 315)
    assert evaluator.manager.alerts() == []
    evaluator.stop()


def test_settings_built_evaluator_posts_to_the_webhook(webhook_receiver) -> None:
    from alerts.embedded import build_evaluator
    from runtime.config import load_settings

    registry = CollectorRegistry()
    gauge = Gauge("fastllm_device_utilization_ratio", "u", ["device"], registry=registry)
    gauge.labels(device="cpu").set(0.95)
    settings = load_settings(alerts_webhook_url=webhook_receiver.url, alerts_interval_s=15.0)
    evaluator = build_evaluator(settings, RegistrySource(registry, instance="rt:8000"))
    for t in range(0, 301, 15):
        evaluator.tick(T0 + t)
    payloads = webhook_receiver.wait_for(lambda ps: len(ps) >= 1)
    evaluator.stop()
    [alert] = payloads[0].alerts
    assert payloads[0].status == "firing" and payloads[0].version == "4"
    assert alert.labels["alertname"] == HIGH and alert.labels["instance"] == "rt:8000"
    assert alert.starts_at.timestamp() == T0 + 300
    assert alert.generator_url.startswith("http://127.0.0.1:8000/graph?g0.expr=")
