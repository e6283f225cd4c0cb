from __future__ import annotations

import dataclasses
import math
import time

import pytest
from prometheus_client import CollectorRegistry

from monitoring.metrics import FastllmMetrics
from monitoring.prometheus_sink import BusyWindow, PrometheusSink
from tests.monitoring import synthetic as syn

BUCKETS = [0.001, 0.01, 0.1, 1.0, 10.0]
MV = {"model": syn.MODEL, "version": syn.VERSION}
MVE = {**MV, "endpoint": "completions"}  # the request metrics: synthetic requests are completions


@pytest.fixture
def sink() -> PrometheusSink:
    metrics = FastllmMetrics.create(CollectorRegistry(), latency_buckets_s=BUCKETS)
    return PrometheusSink(metrics, models=[(syn.MODEL, syn.VERSION)], anomaly_threshold=0.01)


def value(sink: PrometheusSink, name: str, **labels: str) -> float | None:
    return sink.metrics.registry.get_sample_value(name, labels)


def test_token_counters_equal_the_sums(sink: PrometheusSink) -> None:
    requests = syn.random_requests(25, seed=7, t0=1000.0)
    sink.record(finished=requests[:10])
    sink.record(finished=requests[10:])
    assert value(sink, "fastllm_prompt_tokens_total", **MVE) == sum(
        r.prompt_tokens for r in requests
    )
    assert value(sink, "fastllm_generation_tokens_total", **MVE) == sum(
        r.completion_tokens for r in requests
    )
    for reason in ("stop", "length", "cancelled"):
        expected = sum(r.finished_reason == reason for r in requests)
        assert (
            value(sink, "fastllm_request_success_total", **MVE, finished_reason=reason) == expected
        )
    assert value(sink, "fastllm_e2e_request_latency_seconds_count", **MVE) == len(requests)
    assert value(sink, "fastllm_e2e_request_latency_seconds_sum", **MVE) == pytest.approx(
        sum(r.e2e_seconds or 0.0 for r in requests)
    )
    # TTFT of every synthetic request is 0.05 s: all land in the 0.1 bucket, none in 0.01
    assert value(sink, "fastllm_time_to_first_token_seconds_bucket", **MVE, le="0.01") == 0
    assert value(sink, "fastllm_time_to_first_token_seconds_bucket", **MVE, le="0.1") == 25


def test_validation_failure_counts_without_latency(sink: PrometheusSink) -> None:
    assert value(sink, "fastllm_request_failure_total", **MVE, reason="validation") == 0
    sink.record(finished=[syn.rejected_request("bad-1", ts=5.0)])
    sink.record(finished=[syn.rejected_request("bad-2", "timeout", ts=6.0)])
    assert value(sink, "fastllm_request_failure_total", **MVE, reason="validation") == 1
    assert value(sink, "fastllm_request_failure_total", **MVE, reason="timeout") == 1
    # the rejected request never entered the engine; the timed-out one did
    assert value(sink, "fastllm_e2e_request_latency_seconds_count", **MVE) == 1


def test_unknown_model_does_not_grow_labels(sink: PrometheusSink) -> None:
    bad = syn.rejected_request("bad", ts=1.0)
    bad.model = "attacker-chosen-name"
    sink.record(finished=[bad])
    labels = {"model": "unknown", "version": "unknown", "endpoint": "completions"}
    labels["reason"] = "validation"
    assert value(sink, "fastllm_request_failure_total", **labels) == 1


@pytest.mark.parametrize(
    ("operation", "endpoint"),
    [
        ("text_completion", "completions"),
        ("chat", "chat"),
        ("responses", "responses"),
        ("messages", "messages"),
        ("embeddings", "embeddings"),
        ("attacker-chosen", "other"),
    ],
)
def test_request_metrics_are_labelled_by_endpoint(
    sink: PrometheusSink, operation: str, endpoint: str
) -> None:
    request = syn.random_requests(1, seed=3, t0=1000.0)[0]
    request.operation = operation
    sink.record(finished=[request])
    labels = {**MV, "endpoint": endpoint}
    assert value(sink, "fastllm_prompt_tokens_total", **labels) == request.prompt_tokens
    assert value(sink, "fastllm_e2e_request_latency_seconds_count", **labels) == 1
    others = [e for e in ("completions", "chat", "responses", "messages") if e != endpoint]
    for other in others:  # pre-initialised at zero, untouched
        assert value(sink, "fastllm_e2e_request_latency_seconds_count", **MV, endpoint=other) == 0
    assert value(sink, "fastllm_e2e_request_latency_seconds_count", **MV, endpoint=operation) in (
        None,
        1.0 if operation == endpoint else None,
    )  # no series for a label value outside the table


def test_step_maps_scheduler_state_and_allocator_deltas(sink: PrometheusSink) -> None:
    sink.record(step=syn.step(1, ts=100.0, num_seqs=3, allocator=syn.allocator_stats(2)))
    sink.record(step=syn.step(2, ts=101.0, num_seqs=5, allocator=syn.allocator_stats(7)))
    assert value(sink, "fastllm_batch_size_count", **MV) == 2
    assert value(sink, "fastllm_batch_size_sum", **MV) == 8
    assert value(sink, "fastllm_batch_size_limit", **MV) == 16
    assert value(sink, "fastllm_num_requests_waiting", **MV) == 3
    assert value(sink, "fastllm_num_requests_running", **MV) == 5
    # cumulative TierStats -> counters equal the last cumulative value
    assert value(sink, "fastllm_allocator_events_total", tier="small", event="hit") == 21
    assert value(sink, "fastllm_allocator_events_total", tier="large", event="evict") == 3
    assert value(sink, "fastllm_allocator_bytes", tier="medium", state="in_use") == 1024 * 7 * 2
    # a second device adds to the gauges, and its counters start from zero
    sink.record(step=syn.step(3, ts=102.0, allocator=syn.allocator_stats(1, device="cuda:1")))
    assert value(sink, "fastllm_allocator_bytes", tier="small", state="cached") == 512 * 8
    assert value(sink, "fastllm_allocator_events_total", tier="small", event="miss") == 8


def test_anomalies_beyond_threshold_including_nan(sink: PrometheusSink) -> None:
    sink.record(
        verified=[
            syn.verification("geglu", 0.5, ts=1.0),
            syn.verification("geglu", 0.001, ts=1.0),
            syn.verification("attention", math.nan, ts=1.0),
        ]
    )
    assert value(sink, "fastllm_operator_anomalies_total", **MV, op="geglu") == 1
    assert value(sink, "fastllm_operator_anomalies_total", **MV, op="attention") == 1
    assert value(sink, "fastllm_operator_anomalies_total", **MV, op="rms_norm") == 0


def test_steals_and_dropped_rows(sink: PrometheusSink) -> None:
    sink.on_log_dropped(3)
    pool_steals = [2]  # cumulative, as PoolStats.num_steals
    sink.set_steals_source(lambda: pool_steals[0])
    sink.record(step=syn.step(1, ts=1.0))
    assert value(sink, "fastllm_scheduler_steals_total") == 2
    pool_steals[0] = 6
    sink.record(step=syn.step(2, ts=2.0))
    sink.record(step=syn.step(3, ts=3.0))
    assert value(sink, "fastllm_scheduler_steals_total") == 6  # synced, not added twice
    assert value(sink, "fastllm_inference_log_dropped_total", reason="queue_full") == 3
    sink.on_log_dropped(2, "unstorable")
    assert value(sink, "fastllm_inference_log_dropped_total", reason="unstorable") == 2


def test_log_queue_rows_are_read_at_scrape_time(sink: PrometheusSink) -> None:
    assert value(sink, "fastllm_inference_log_queue_rows") == 0  # no writer: shown at zero
    queued = [7]
    sink.set_log_queue_source(lambda: queued[0])
    assert value(sink, "fastllm_inference_log_queue_rows") == 7
    queued[0] = 0
    assert value(sink, "fastllm_inference_log_queue_rows") == 0


def test_busy_window_and_external_utilization(sink: PrometheusSink) -> None:
    window = BusyWindow(window_s=10.0)
    now = time.time()
    for k in range(6):  # 1 s busy every 2 s; the first step ended 11 s ago, outside the window
        window.add(syn.step(k, ts=now - 11 + 2 * k, busy_seconds=1.0))
    assert window.fraction(now) == pytest.approx(5.0 / 10.0)
    assert window.fraction(now + 100) == 0.0  # idle: every step has left the window
    cpu_u = value(sink, "fastllm_device_utilization_ratio", device="cpu")
    assert cpu_u is not None and math.isnan(cpu_u)  # no engine signal wired: NaN, not a guess
    sink.set_utilization_source(lambda: 0.75, "cuda:0")
    assert value(sink, "fastllm_device_utilization_ratio", device="cuda:0") == 0.75
    assert value(sink, "fastllm_device_utilization_ratio", device="cpu") is None
    sink.set_busy_source(lambda: None, "cuda:0")  # NVML without a reading: the step busy share
    assert value(sink, "fastllm_device_busy_ratio", device="cuda:0") == sink.busy.fraction()
    assert value(sink, "fastllm_device_busy_ratio", device="cpu") is None
    sink.set_busy_source(lambda: 0.97, "cuda:0")
    assert value(sink, "fastllm_device_busy_ratio", device="cuda:0") == 0.97


def test_allocator_source_fills_steps_without_allocator_stats(sink: PrometheusSink) -> None:
    sink.set_allocator_source(lambda: syn.allocator_stats(3))
    sink.record(step=syn.step(1, ts=1.0))
    assert value(sink, "fastllm_allocator_events_total", tier="medium", event="release") == 6
    sink.record(step=syn.step(2, ts=2.0, allocator=syn.allocator_stats(5)))  # the step's own wins
    assert value(sink, "fastllm_allocator_events_total", tier="medium", event="release") == 10


def test_busy_window_stays_bounded_when_nobody_reads_it() -> None:
    # with an NVML source fraction() never runs: add() must prune on its own
    window = BusyWindow(window_s=10.0)
    for k in range(5_000):
        window.add(syn.step(k, ts=1000.0 + 0.1 * k, busy_seconds=0.05))
    assert len(window._steps) <= 101


def test_kv_cache_numbers_map_to_gauges_and_counter_deltas(sink: PrometheusSink) -> None:
    for state in ("used", "cached", "free"):  # the series exist before any step
        assert value(sink, "fastllm_kv_cache_pages", **MV, state=state) == 0
    for step_id in range(8):
        sink.record(step=syn.step(step_id, ts=1000.0 + step_id))
    last = syn.kv_stats(7)
    assert value(sink, "fastllm_kv_cache_usage_ratio", **MV) == last.num_used_pages / 100
    assert value(sink, "fastllm_kv_cache_pages", **MV, state="used") == last.num_used_pages
    assert value(sink, "fastllm_kv_cache_pages", **MV, state="cached") == 5
    assert value(sink, "fastllm_kv_cache_pages", **MV, state="free") == last.num_free_pages
    # cumulative counts become counters that equal them (not their sum over steps)
    assert value(sink, "fastllm_prefix_cache_queries_total", **MV) == last.prefix_query_tokens
    assert value(sink, "fastllm_prefix_cache_hits_total", **MV) == last.prefix_hit_tokens
    assert value(sink, "fastllm_num_preemptions_total", **MV) == last.num_preemptions == 2
    sink.record(step=syn.step(0, ts=2000.0))  # a new engine starts from 0: counts go on
    assert value(sink, "fastllm_prefix_cache_hits_total", **MV) == last.prefix_hit_tokens + 16


def test_compile_fallbacks_follow_the_step_stats(sink: PrometheusSink) -> None:
    """0 from the start (a served model with nothing compiled, or compiled and running), 1 once
    the engine's steps say the compiled decode step fell back to the eager forward."""
    assert value(sink, "fastllm_compile_fallbacks", **MV) == 0
    sink.record(step=syn.step(1, ts=100.0))
    assert value(sink, "fastllm_compile_fallbacks", **MV) == 0
    sink.record(step=dataclasses.replace(syn.step(2, ts=101.0), compile_fallbacks=1))
    assert value(sink, "fastllm_compile_fallbacks", **MV) == 1
