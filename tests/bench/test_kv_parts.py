"""bench.kv reads the hit rate from a real /metrics text: the exposition the runtime serves."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest

from bench.kv_server import hit_rate
from monitoring.metrics import FastllmMetrics
from monitoring.prometheus_sink import PrometheusSink
from tests.monitoring import synthetic as syn


def test_hit_rate_is_hits_over_queries_of_the_scrape() -> None:
    metrics = FastllmMetrics.create(CollectorRegistry(), latency_buckets_s=[0.1, 1.0])
    sink = PrometheusSink(metrics, models=[(syn.MODEL, syn.VERSION)])
    assert hit_rate(generate_latest(metrics.registry).decode()) == 0.0  # no query yet
    for step_id in range(5):
        sink.record(step=syn.step(step_id, ts=time.time()))
    kv = syn.kv_stats(4)
    rate = hit_rate(generate_latest(metrics.registry).decode())
    assert rate == kv.prefix_hit_tokens / kv.prefix_query_tokens == 16 / 96
