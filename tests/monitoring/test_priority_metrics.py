"""Metrics per priority: each request that entered the engine counts under its priority (clamped
to [-10, 10]), with its queue time and TTFT; refused requests and made-up model names do not
grow the label sets."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from monitoring.priority_metrics import PriorityMetrics, PrioritySink, priority_label
from runtime.engine.stats import FailureReason
from tests.monitoring import synthetic as syn

MV = {"model": syn.MODEL, "version": syn.VERSION}


REGISTRY: dict[int, CollectorRegistry] = {}


@pytest.fixture
def sink() -> PrioritySink:
    registry = CollectorRegistry()
    metrics = PriorityMetrics.create(registry, [0.01, 0.1, 1.0])
    out = PrioritySink(metrics, models=[(syn.MODEL, syn.VERSION)])
    REGISTRY[id(out)] = registry
    return out


def value(sink: PrioritySink, name: str, **labels: str) -> float | None:
    return REGISTRY[id(sink)].get_sample_value(name, labels)


def test_requests_count_under_their_priority(sink: PrioritySink) -> None:
    assert value(sink, "fastllm_priority_requests_total", **MV, priority="0") == 0  # pre-made
    requests = syn.random_requests(6, seed=2, t0=1000.0)
    for r, p in zip(requests, (0, 0, -3, 7, 99, -50), strict=True):
        r.priority = p
    sink.record(finished=requests)
    counts = {
        p: value(sink, "fastllm_priority_requests_total", **MV, priority=p)
        for p in ("0", "-3", "7", "10", "-10")
    }
    assert counts == {"0": 2, "-3": 1, "7": 1, "10": 1, "-10": 1}
    ttft = value(sink, "fastllm_priority_time_to_first_token_seconds_count", **MV, priority="0")
    assert ttft == sum(r.ttft_seconds is not None for r in requests[:2])
    queued = value(sink, "fastllm_priority_request_queue_seconds_sum", **MV, priority="-3")
    assert queued == pytest.approx(requests[2].queue_seconds or 0.0)


def test_refused_requests_and_unknown_models_are_not_counted(sink: PrioritySink) -> None:
    refused = syn.rejected_request("bad", ts=1.0)
    assert refused.failure_reason == FailureReason.VALIDATION
    stranger = syn.random_requests(1, seed=1, t0=1.0)[0]
    stranger.model = "attacker-chosen"
    sink.record(finished=[refused, stranger])
    assert value(sink, "fastllm_priority_requests_total", **MV, priority="0") == 0
    labels = {"model": "attacker-chosen", "version": syn.VERSION, "priority": "0"}
    assert value(sink, "fastllm_priority_requests_total", **labels) is None


def test_the_label_is_bounded() -> None:
    assert [priority_label(p) for p in (-(1 << 31), -10, -1, 0, 10, 1 << 31)] == [
        "-10",
        "-10",
        "-1",
        "0",
        "10",
        "10",
    ]
