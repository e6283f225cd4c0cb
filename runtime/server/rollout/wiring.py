"""Wires a RolloutController into one server: it listens on the engines' FanOut, and each rollout
event becomes metrics on the app's registry, an `alert_events` row for a rollback (when storage is
on), and, for a promotion, a background drain of the retired engine.

    fastllm_rollout_canary_weight{model}                     gauge, the canary's current share
    fastllm_rollout_events_total{model,action}               counter: set_weight, promote, rollback
    fastllm_rollout_rollbacks_total{model,version,reason}    counter: error_rate, anomaly_rate,
                                                             operator

With peers configured (`rollout_peers`, `rollout_peers_dns`), a RolloutSync keeps the replicas
agreeing (runtime/serving/rollout_sync.py). An event adopted from a peer moves this replica's weight
gauge and events counter, but the rollback counter and the `alert_events` row belong to the
replica that decided it, so summing over replicas counts each decision once.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone
from typing import Any

from prometheus_client import Counter, Gauge

from runtime.server.state import ServerState
from runtime.serving.peers import replica_urls
from runtime.serving.rollout import RolloutController, RolloutEvent, RolloutPolicy
from runtime.serving.rollout_sync import RolloutSync

log = logging.getLogger("fastllm.rollout")
ROLLBACK_ALERT = "FastllmCanaryRolledBack"


def policy_from_settings(settings: Any) -> RolloutPolicy:
    from runtime.verify.tolerance import anomaly_threshold  # the audit's and the anomaly counter's

    return RolloutPolicy(
        window_s=settings.rollout_window_s,
        min_requests=settings.rollout_min_requests,
        max_error_rate_delta=settings.rollout_max_error_rate_delta,
        max_anomaly_rate_delta=settings.rollout_max_anomaly_rate_delta,
        anomaly_threshold=anomaly_threshold(settings),
        auto_rollback=settings.rollout_auto_rollback,
    )


def attach_rollout(state: ServerState) -> RolloutController:
    settings = state.settings
    controller = RolloutController(state.router, policy_from_settings(settings))
    weight = Gauge(
        "fastllm_rollout_canary_weight",
        "Share of requests routed to the canary version.",
        ["model"],
        registry=state.registry,
    )
    events = Counter(
        "fastllm_rollout_events_total",
        "Rollout actions (set_weight, promote, rollback).",
        ["model", "action"],
        registry=state.registry,
    )
    rollbacks = Counter(
        "fastllm_rollout_rollbacks_total",
        "Canary rollbacks, by reason (error_rate, anomaly_rate: automatic; operator).",
        ["model", "version", "reason"],
        registry=state.registry,
    )
    for model, route in state.router.routes.items():
        if route.canary is not None:
            weight.labels(model).set(route.canary_weight)
            for action in ("set_weight", "promote", "rollback"):
                events.labels(model, action)
            for reason in ("error_rate", "anomaly_rate", "operator"):
                rollbacks.labels(model, route.canary.name, reason)

    def on_event(event: RolloutEvent) -> None:
        weight.labels(event.model).set(event.canary_weight)
        events.labels(event.model, event.action).inc()
        if event.action == "rollback" and not event.origin:
            rollbacks.labels(event.model, event.canary or "", event.reason).inc()
            if settings.storage_enabled:
                _store_alert_event(settings.database_url, event)
        if event.retired is not None:
            _drain_in_background(event.retired.engine, settings.drain_grace_s)

    controller.listeners.append(on_event)
    state.stats.add(controller)
    return controller


def attach_rollout_sync(state: ServerState, controller: RolloutController) -> RolloutSync | None:
    """Sync with the configured peers (started and stopped with the app), or None without any."""
    settings = state.settings
    if not (settings.rollout_peers or settings.rollout_peers_dns):
        return None
    if not settings.admin_token:
        log.warning("rollout peers are configured but no admin token is: rollout sync is off")
        return None
    peers, dns = list(settings.rollout_peers), settings.rollout_peers_dns
    sync = RolloutSync(
        controller,
        lambda: replica_urls(peers, dns),
        admin_token=settings.admin_token,
        interval_s=settings.rollout_sync_interval_s,
    )

    def on_event(event: RolloutEvent) -> None:
        if not event.origin:  # decided here: tell the others now rather than at their next round
            sync.notify_peers()

    controller.listeners.append(on_event)
    state.on_start.append(sync.start)
    state.on_stop.append(sync.stop)
    return sync


def _store_alert_event(database_url: str, event: RolloutEvent) -> None:
    """One `alert_events` row, written off the engine thread (a rollback may come from there)."""
    from storage import AlertRecord, MetricStore, open_database

    labels = {"model": event.model, "version": event.canary or "", "reason": event.reason}
    annotations = {
        "summary": f"canary {event.canary} of {event.model} rolled back ({event.reason})",
        "description": event.detail or "rolled back by an operator",
    }
    record = AlertRecord(
        alertname=ROLLBACK_ALERT,
        state="firing",
        ts=datetime.fromtimestamp(event.ts, tz=timezone.utc),
        labels=labels,
        annotations=annotations,
        value=event.delta,
    )

    def write() -> None:
        try:
            engine = open_database(database_url, migrate=True)
            try:
                MetricStore(engine).add_alert_events([record])
            finally:
                engine.dispose()
        except Exception:  # the rollback itself already happened; losing the row is logged
            log.exception("could not store the rollback alert event")

    threading.Thread(target=write, name="rollout-alert-event", daemon=True).start()


def _drain_in_background(engine: Any, grace_s: float) -> None:
    """A promoted-away engine finishes what it holds (up to the drain grace), then stops."""
    threading.Thread(
        target=engine.shutdown, args=(grace_s,), name="rollout-retire", daemon=True
    ).start()
