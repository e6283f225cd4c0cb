"""Wiring for `fastllm serve`: the evaluator built from Settings, reading the server's own
registry. The server calls `start_embedded(settings, registry)` after its metrics exist and
`evaluator.stop()` on shutdown."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from alerts.cached_store import CachedSampleStore
from alerts.evaluator import AlertEvaluator, EvaluatorConfig
from alerts.events import EventSink, MemoryEvents, SqlEvents
from alerts.notifiers import build_notifiers
from alerts.sources import MetricSource, RegistrySource
from alerts.store import MemorySampleStore, SampleStore

if TYPE_CHECKING:
    from runtime.config import Settings
    from storage.store import MetricStore


def build_evaluator(
    settings: Settings,
    source: MetricSource,
    *,
    metric_store: MetricStore | None = None,
    clock: Callable[[], float] = time.time,
    extra_names: Iterable[str] = (),
    min_retention_s: float = 0.0,
) -> AlertEvaluator:
    """Samples and events go to SQL (`metric_samples`, `alert_events`) when a MetricStore is
    given, else to memory; notifiers from settings (webhook, Alertmanager) plus the log.
    `extra_names` are sampled beside the rules' metrics and kept `min_retention_s` at least
    (the status page's panels)."""
    config = replace(
        EvaluatorConfig.from_settings(settings),
        extra_names=frozenset(extra_names),
        min_retention_s=min_retention_s,
    )
    store: SampleStore
    events: EventSink
    if metric_store is not None:
        from alerts.sql_store import SqlSampleStore

        # only the instance this evaluator samples (others may share the database); reads of what
        # this process sampled come from memory (the rules every round, the status page's panels);
        # the table keeps every point and a previous run's history
        store = CachedSampleStore(SqlSampleStore(metric_store, instances={source.instance}))
        events = SqlEvents(metric_store)
    else:
        store, events = MemorySampleStore(), MemoryEvents()
    notifiers = build_notifiers(
        webhook_url=settings.alerts_webhook_url,
        alertmanager_url=settings.alertmanager_url,
        external_url=config.external_url,
        valid_for_s=4 * max(60.0, config.interval_s),
    )
    return AlertEvaluator(
        config, source, store=store, notifiers=notifiers, events=events, clock=clock
    )


def start_embedded(
    settings: Settings,
    registry: CollectorRegistry,
    *,
    metric_store: MetricStore | None = None,
) -> AlertEvaluator | None:
    """Start evaluating the rules against `registry`; None when alerts are disabled."""
    if not settings.alerts_enabled:
        return None
    source = RegistrySource(registry, instance=f"{settings.host}:{settings.port}")
    evaluator = build_evaluator(settings, source, metric_store=metric_store)
    evaluator.start()
    return evaluator
