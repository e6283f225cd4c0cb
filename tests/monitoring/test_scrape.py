"""The metric contract proven against real tools: promtool lints the scrape, a real Prometheus
scrapes it and answers an instant query for every name of the DESIGN.md contract table."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from monitoring.metric_names import CONTRACT_METRIC_NAMES
from monitoring.wiring import Monitoring, create_monitoring
from runtime.config import Settings
from tests.fixtures.prometheus import PromHandle, check_metrics
from tests.monitoring import synthetic as syn

# Transcribed from the DESIGN.md contract table: name -> (type, label names besides model/version).
# The request metrics (tokens, success/failure, latency histograms) carry `endpoint` too (issue
# 38): completions | chat | responses | messages | embeddings | other.
# `fastllm_memory_total` is exposed untyped (see monitoring/samplers.py): promtool rejects a gauge
# whose name ends in `_total`, and the name is fixed by the operations guide.
CONTRACT: dict[str, tuple[str, set[str]]] = {
    "fastllm_memory_usage": ("gauge", {"type"}),
    "fastllm_memory_total": ("unknown", {"type"}),
    "fastllm_device_utilization_ratio": ("gauge", {"device"}),
    "fastllm_device_busy_ratio": ("gauge", {"device"}),
    "fastllm_batch_size": ("histogram", {"model", "version"}),
    "fastllm_batch_size_limit": ("gauge", {"model", "version"}),
    "fastllm_num_requests_running": ("gauge", {"model", "version"}),
    "fastllm_num_requests_waiting": ("gauge", {"model", "version"}),
    "fastllm_time_to_first_token_seconds": ("histogram", {"model", "version", "endpoint"}),
    "fastllm_time_per_output_token_seconds": ("histogram", {"model", "version", "endpoint"}),
    "fastllm_e2e_request_latency_seconds": ("histogram", {"model", "version", "endpoint"}),
    "fastllm_request_queue_seconds": ("histogram", {"model", "version", "endpoint"}),
    "fastllm_prompt_tokens_total": ("counter", {"model", "version", "endpoint"}),
    "fastllm_generation_tokens_total": ("counter", {"model", "version", "endpoint"}),
    "fastllm_request_success_total": (
        "counter",
        {"model", "version", "endpoint", "finished_reason"},
    ),
    "fastllm_request_failure_total": ("counter", {"model", "version", "endpoint", "reason"}),
    "fastllm_allocator_bytes": ("gauge", {"tier", "state"}),
    "fastllm_allocator_events_total": ("counter", {"tier", "event"}),
    "fastllm_operator_anomalies_total": ("counter", {"model", "version", "op"}),
    "fastllm_scheduler_steals_total": ("counter", set()),
    "fastllm_inference_log_dropped_total": ("counter", {"reason"}),
    "fastllm_inference_log_queue_rows": ("gauge", set()),
    "fastllm_kv_cache_usage_ratio": ("gauge", {"model", "version"}),
    "fastllm_kv_cache_pages": ("gauge", {"model", "version", "state"}),
    "fastllm_prefix_cache_queries_total": ("counter", {"model", "version"}),
    "fastllm_prefix_cache_hits_total": ("counter", {"model", "version"}),
    "fastllm_num_preemptions_total": ("counter", {"model", "version"}),
    "fastllm_constrained_requests_total": ("counter", {"model", "version", "kind"}),
    "fastllm_grammar_compile_seconds": ("histogram", {"model", "version"}),
    "fastllm_grammar_cache_hits_total": ("counter", {"model", "version"}),
    "fastllm_grammar_cache_misses_total": ("counter", {"model", "version"}),
    "fastllm_grammar_incomplete_total": ("counter", {"model", "version"}),
    "fastllm_grammar_cache_events_total": ("counter", {"model", "version", "event"}),
    "fastllm_compile_fallbacks": ("gauge", {"model", "version"}),
    "fastllm_priority_requests_total": ("counter", {"model", "version", "priority"}),
    "fastllm_priority_request_queue_seconds": ("histogram", {"model", "version", "priority"}),
    "fastllm_priority_time_to_first_token_seconds": (
        "histogram",
        {"model", "version", "priority"},
    ),
    "fastllm_spec_decode_num_draft_tokens_total": ("counter", {"model", "version", "method"}),
    "fastllm_spec_decode_num_accepted_tokens_total": ("counter", {"model", "version", "method"}),
    "fastllm_spec_decode_num_emitted_tokens_total": ("counter", {"model", "version", "method"}),
    "fastllm_spec_decode_acceptance_ratio": ("histogram", {"model", "version", "method"}),
}


def make_monitoring(allocator_scale: list[int]) -> Monitoring:
    settings = Settings(model_name=syn.MODEL, model_version=syn.VERSION, kv_cache_bytes=64 << 20)
    return create_monitoring(
        settings, allocator_stats=lambda: syn.allocator_stats(allocator_scale[0])
    )


def feed(mon: Monitoring, requests: list, start_step: int) -> None:
    now = time.time()
    for k, request in enumerate(requests):
        step = syn.step(start_step + k, ts=now, allocator=syn.allocator_stats(start_step + k + 1))
        mon.prometheus.record(step=step, finished=[request])
    mon.prometheus.record(finished=[syn.rejected_request("bad", ts=now)])
    mon.prometheus.record(verified=[syn.verification("geglu", 1.0, ts=now)])
    mon.prometheus.set_steals_source(lambda: 2)
    mon.prometheus.record(step=syn.step(start_step + len(requests), ts=now))
    mon.prometheus.on_log_dropped()


def families(registry: CollectorRegistry) -> dict[str, tuple[str, set[str]]]:
    from prometheus_client import generate_latest

    out: dict[str, tuple[str, set[str]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        name = family.name + ("_total" if family.type == "counter" else "")
        out[name] = (family.type, labels)
    return out


def test_contract_table_matches_the_code() -> None:
    assert set(CONTRACT_METRIC_NAMES) == set(CONTRACT)


@pytest.mark.parametrize("traffic", [False, True], ids=["before-traffic", "after-traffic"])
def test_scrape_has_every_contract_name_and_passes_promtool(traffic: bool) -> None:
    mon = make_monitoring([1])
    if traffic:
        feed(mon, syn.random_requests(5, seed=1, t0=time.time() - 10), start_step=0)
    assert check_metrics(mon.render().decode()) == []
    seen = families(mon.registry)
    for name, (kind, labels) in CONTRACT.items():
        assert name in seen, name
        assert seen[name] == (kind, labels), name
    assert "fastllm_build_info" in seen


def test_promtool_reports_a_bad_metric() -> None:
    """The lint is live: a gauge named like a counter is reported."""
    bad = "# HELP x_total a gauge\n# TYPE x_total gauge\nx_total 1\n"
    assert check_metrics(bad) != []


def test_real_prometheus_scrape(
    prometheus_server: Callable[..., PromHandle],
    serve_registry: Callable[[CollectorRegistry], str],
) -> None:
    scale = [4]
    mon = make_monitoring(scale)
    requests = syn.random_requests(12, seed=3, t0=time.time() - 30)
    feed(mon, requests, start_step=0)
    prom = prometheus_server([serve_registry(mon.registry)])
    prom.wait_for_scrape()

    for name, (kind, _labels) in CONTRACT.items():
        series = f"{name}_count" if kind == "histogram" else name
        assert prom.query(series), f"no sample for {series}"

    # The operations guide's query, in its cpu form (the gpu type is absent on CPU, not faked).
    fraction = prom.query('fastllm_memory_usage{type="cpu"} / fastllm_memory_total')
    assert [s.labels["type"] for s in fraction] == ["cpu"]
    assert 0.0 < fraction[0].value < 1.0
    assert prom.query('fastllm_memory_usage{type="gpu"} / fastllm_memory_total') == []
    allocator = prom.query('fastllm_memory_usage{type="allocator"} / fastllm_memory_total')
    assert allocator[0].value == pytest.approx(4 * 1024 * 6 / (64 << 20))

    mv = f'{{model="{syn.MODEL}",version="{syn.VERSION}"}}'
    assert prom.query(f"sum(fastllm_prompt_tokens_total{mv})")[0].value == sum(
        r.prompt_tokens for r in requests
    )
    assert prom.query(f"sum(fastllm_generation_tokens_total{mv})")[0].value == sum(
        r.completion_tokens for r in requests
    )
    failures = prom.query('sum by (endpoint) (fastllm_request_failure_total{reason="validation"})')
    by_endpoint = {s.labels["endpoint"]: s.value for s in failures}
    assert by_endpoint.pop("completions") == 1.0  # the synthetic rejected request's
    assert set(by_endpoint) == {"chat", "responses", "messages", "embeddings", "other"}
    assert set(by_endpoint.values()) == {0.0}
    assert prom.query("sum(fastllm_request_success_total)")[0].value == len(requests)

    # Later traffic shows up in the next scrape (the registry is live, not a snapshot).
    more = syn.random_requests(3, seed=4, t0=time.time())
    feed(mon, more, start_step=len(requests))
    scale[0] = 9
    prom.wait_for_scrape()
    assert prom.query(f"sum(fastllm_prompt_tokens_total{mv})")[0].value == sum(
        r.prompt_tokens for r in requests + more
    )
    assert prom.query('fastllm_memory_usage{type="allocator"}')[0].value == 9 * 1024 * 6
