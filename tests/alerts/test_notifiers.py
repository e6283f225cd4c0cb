"""Notifiers against a real Alertmanager (prometheus-alertmanager) on loopback, and the
background delivery that keeps a failing receiver away from rule evaluation."""

from __future__ import annotations

import threading
import time

from alerts.fingerprint import fingerprint
from alerts.notifiers import (
    AlertmanagerNotifier,
    Background,
    Notification,
    WebhookNotifier,
)
from alerts.payload import WebhookPayload
from alerts.state import FIRING, RESOLVED, Alert

LABELS = {
    "alertname": "FastllmDeviceUtilizationHigh",
    "severity": "warning",
    "device": "cpu",
    "instance": "127.0.0.1:8000",
    "job": "fastllm",
}
EXPR = {"FastllmDeviceUtilizationHigh": "fastllm_device_utilization_ratio > 0.9"}


def _alert(state: str, now: float) -> Alert:
    return Alert(
        labels=dict(LABELS),
        annotations={"summary": "fastllm device cpu is saturated.", "runbook_url": "x#y"},
        value=0.95,
        state=state,
        active_at=now - 300,
        fired_at=now - 1,
        resolved_at=now if state == RESOLVED else None,
        fingerprint=fingerprint(LABELS),
    )


def test_pushed_alert_reaches_alertmanager_and_its_webhook(alertmanager_server, webhook_receiver):
    am = alertmanager_server(webhook_receiver.url)
    now = time.time()
    pusher = AlertmanagerNotifier(am.url, external_url="http://127.0.0.1:8000")
    pusher.send(Notification([_alert(FIRING, now)], now, EXPR))

    listed = am.alerts()
    assert [a["labels"] for a in listed] == [LABELS]
    assert listed[0]["status"]["state"] == "active"
    # Alertmanager's own fingerprint equals ours (FNV-1a over the sorted label set)
    assert listed[0]["fingerprint"] == fingerprint(LABELS)
    assert listed[0]["generatorURL"].startswith("http://127.0.0.1:8000/graph?g0.expr=")

    firing = webhook_receiver.wait_for(lambda ps: any(p.status == "firing" for p in ps))
    payload = next(p for p in firing if p.status == "firing")
    assert payload.version == "4" and payload.receiver == "test"
    assert payload.common_labels == LABELS
    assert [a.fingerprint for a in payload.alerts] == [fingerprint(LABELS)]
    assert payload.alerts[0].annotations["summary"] == "fastllm device cpu is saturated."
    assert abs(payload.alerts[0].starts_at.timestamp() - (now - 1)) < 0.01

    later = time.time()
    pusher.send(Notification([_alert(RESOLVED, later)], later, EXPR))
    resolved = webhook_receiver.wait_for(lambda ps: any(p.status == "resolved" for p in ps))
    done = next(p for p in resolved if p.status == "resolved")
    assert done.alerts[0].status == "resolved"
    assert abs(done.alerts[0].ends_at.timestamp() - later) < 0.01


def test_our_webhook_body_has_alertmanagers_shape(alertmanager_server, webhook_receiver):
    am = alertmanager_server(webhook_receiver.url)
    now = time.time()
    AlertmanagerNotifier(am.url).send(Notification([_alert(FIRING, now)], now, EXPR))
    webhook_receiver.wait_for(lambda ps: len(ps) >= 1)
    from_alertmanager = webhook_receiver.raw[0]

    WebhookNotifier(webhook_receiver.url, receiver="test").send(
        Notification([_alert(FIRING, now)], now, EXPR)
    )
    webhook_receiver.wait_for(lambda ps: len(ps) >= 2)
    ours = webhook_receiver.raw[1]
    assert set(ours) == set(from_alertmanager)
    assert set(ours["alerts"][0]) == set(from_alertmanager["alerts"][0])
    for key in ("version", "status", "receiver", "commonLabels", "groupLabels"):
        assert ours[key] == from_alertmanager[key], key
    assert ours["alerts"][0]["fingerprint"] == from_alertmanager["alerts"][0]["fingerprint"]
    assert ours["alerts"][0]["endsAt"] == from_alertmanager["alerts"][0]["endsAt"]  # zero time
    WebhookPayload.model_validate(ours)


def test_background_retries_a_failing_receiver(webhook_receiver):
    webhook_receiver.fail_next(2)
    worker = Background(WebhookNotifier(webhook_receiver.url), backoff_s=0.01, attempts=4)
    now = time.time()
    worker.submit(Notification([_alert(FIRING, now)], now, EXPR))
    assert worker.flush()
    assert (worker.num_sent, worker.num_failed) == (1, 0)
    assert len(webhook_receiver.wait_for(lambda ps: len(ps) == 1)) == 1
    worker.close()


def test_background_gives_up_after_its_attempts(webhook_receiver):
    webhook_receiver.fail_next(10)
    worker = Background(WebhookNotifier(webhook_receiver.url), backoff_s=0.01, attempts=3)
    worker.submit(Notification([_alert(FIRING, time.time())], time.time(), EXPR))
    assert worker.flush()
    assert (worker.num_sent, worker.num_failed) == (0, 1)
    worker.close()


class _Stuck:
    name = "stuck"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def send(self, notification: Notification) -> None:
        self.calls += 1
        self.release.wait(30)


def test_a_stuck_receiver_never_blocks_submit() -> None:
    stuck = _Stuck()
    worker = Background(stuck, max_queue=2)
    for _ in range(50):  # far more than the queue holds: the oldest are dropped, never waited on
        worker.submit(Notification([], 0.0))
    assert worker.queue.qsize() <= 2
    stuck.release.set()
    assert worker.flush()
    assert 1 <= stuck.calls <= 3
    worker.close()
