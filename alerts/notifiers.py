"""Notifiers: an Alertmanager-compatible webhook, a pusher to Alertmanager's /api/v2/alerts and
a log line. Each network notifier runs behind its own queue and thread (`Background`) with
retries and exponential backoff (tenacity), so a slow or failing receiver never blocks rule
evaluation, nor the other receivers."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import httpx
from tenacity import retry, stop_after_attempt, wait_exponential

from alerts.payload import api_v2_alerts, webhook_payload
from alerts.state import Alert

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Notification:
    alerts: list[Alert]  # firing and recently resolved alerts (snapshots)
    now: float  # evaluation time, seconds since the epoch
    expr_of: Mapping[str, str] = field(default_factory=dict)  # alertname -> rule expression


class Notifier(Protocol):
    name: str

    def send(self, notification: Notification) -> None:
        """Deliver once; raise on failure (the Background wrapper retries)."""
        ...


class LogNotifier:
    name = "log"

    def send(self, notification: Notification) -> None:
        for a in notification.alerts:
            log.warning(
                "alert %s %s %s: %s", a.name, a.state, a.labels, a.annotations.get("summary", "")
            )


class WebhookNotifier:
    """POSTs Alertmanager's webhook body (version "4") to `url`, one request per rule."""

    def __init__(
        self,
        url: str,
        *,
        receiver: str = "fastllm",
        external_url: str = "",
        timeout_s: float = 10.0,
    ) -> None:
        self.name = f"webhook {url}"
        self.url = url
        self.receiver = receiver
        self.external_url = external_url
        self.timeout_s = timeout_s

    def send(self, notification: Notification) -> None:
        by_rule: dict[str, list[Alert]] = {}
        for a in notification.alerts:
            by_rule.setdefault(a.name, []).append(a)
        for alerts in by_rule.values():
            body = webhook_payload(
                alerts,
                receiver=self.receiver,
                external_url=self.external_url,
                expr_of=dict(notification.expr_of),
            )
            httpx.post(self.url, json=body, timeout=self.timeout_s).raise_for_status()


class AlertmanagerNotifier:
    """Pushes alerts to an Alertmanager (POST {base}/api/v2/alerts), as Prometheus does."""

    def __init__(
        self,
        base_url: str,
        *,
        external_url: str = "",
        valid_for_s: float = 240.0,
        timeout_s: float = 10.0,
    ) -> None:
        self.name = f"alertmanager {base_url}"
        self.url = base_url.rstrip("/") + "/api/v2/alerts"
        self.external_url = external_url
        self.valid_for_s = valid_for_s
        self.timeout_s = timeout_s

    def send(self, notification: Notification) -> None:
        body = api_v2_alerts(
            notification.alerts,
            now=notification.now,
            valid_for_s=self.valid_for_s,
            external_url=self.external_url,
            expr_of=dict(notification.expr_of),
        )
        httpx.post(self.url, json=body, timeout=self.timeout_s).raise_for_status()


class Background:
    """Runs one notifier on its own daemon thread. `submit` never blocks: when the queue is
    full the oldest notification is dropped (a newer one carries the current state)."""

    def __init__(
        self,
        notifier: Notifier,
        *,
        max_queue: int = 100,
        attempts: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.notifier = notifier
        self.queue: queue.Queue[Notification | None] = queue.Queue(max_queue)
        self.num_sent = 0
        self.num_failed = 0
        self._send = retry(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential(multiplier=backoff_s, max=max_backoff_s),
            reraise=True,
        )(notifier.send)
        self._thread = threading.Thread(
            target=self._run, name=f"notify {notifier.name}", daemon=True
        )
        self._thread.start()

    @property
    def name(self) -> str:
        return self.notifier.name

    def submit(self, notification: Notification) -> None:
        while True:
            try:
                self.queue.put_nowait(notification)
                return
            except queue.Full:
                try:
                    self.queue.get_nowait()
                    self.queue.task_done()
                except queue.Empty:
                    pass

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                self._send(item)
                self.num_sent += 1
            except Exception as exc:
                self.num_failed += 1
                log.warning("notifier %s gave up: %s", self.notifier.name, exc)
            finally:
                self.queue.task_done()
        self.queue.task_done()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything submitted was handled (tests); False on timeout."""
        done = threading.Event()

        def join() -> None:
            self.queue.join()
            done.set()

        threading.Thread(target=join, daemon=True).start()
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        self.submit_stop()
        self._thread.join(timeout_s)

    def submit_stop(self) -> None:
        with contextlib.suppress(queue.Full):
            self.queue.put(None, timeout=1.0)


def build_notifiers(
    *,
    webhook_url: str | None,
    alertmanager_url: str | None,
    external_url: str,
    valid_for_s: float = 240.0,
    log_alerts: bool = True,
) -> list[Background]:
    found: list[Notifier] = [LogNotifier()] if log_alerts else []
    if webhook_url:
        found.append(WebhookNotifier(webhook_url, external_url=external_url))
    if alertmanager_url:
        found.append(
            AlertmanagerNotifier(
                alertmanager_url, external_url=external_url, valid_for_s=valid_for_s
            )
        )
    return [Background(n) for n in found]
