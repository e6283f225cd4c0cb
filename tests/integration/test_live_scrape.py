"""Issue 6 against a live runtime: the real server (wired as `fastllm serve` wires it) serves a
short load; promtool lints its /metrics, a real Prometheus scrapes it every second, and the
counters equal what the responses' `usage` says (the openai client reads those, not our code)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from openai.types import CompletionUsage
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from monitoring.metric_names import CONTRACT_METRIC_NAMES
from tests.fixtures.prometheus import PromHandle, check_metrics
from tests.integration.support import MODEL, live_runtime, runtime_settings

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
HISTOGRAMS = {
    "fastllm_batch_size",
    "fastllm_time_to_first_token_seconds",
    "fastllm_time_per_output_token_seconds",
    "fastllm_e2e_request_latency_seconds",
    "fastllm_request_queue_seconds",
    "fastllm_grammar_compile_seconds",
    "fastllm_priority_request_queue_seconds",
    "fastllm_priority_time_to_first_token_seconds",
    "fastllm_spec_decode_acceptance_ratio",
}


def short_load(client: openai.OpenAI) -> tuple[int, int, int]:
    """Completions and chats, plain and streamed; returns (requests, prompt, generated) tokens
    as the responses report them."""
    usages: list[CompletionUsage | None] = []
    for max_tokens in (3, 7):
        result = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=max_tokens)
        usages.append(result.usage)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5
    )
    usages.append(chat.usage)
    stream = client.completions.create(
        model=MODEL,
        prompt="Once",
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    usages.append([c.usage for c in stream if c.usage is not None][-1])
    chat_stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    usages.append([c.usage for c in chat_stream if c.usage is not None][-1])
    known = [u for u in usages if u is not None]
    assert len(known) == len(usages)
    prompt = sum(u.prompt_tokens for u in known)
    generated = sum(u.completion_tokens for u in known)
    return len(known), prompt, generated


def test_live_runtime_scrape(
    demo_model_dir: Callable[[str], Path], prometheus_server: Callable[..., PromHandle]
) -> None:
    settings = runtime_settings(demo_model_dir("llama"))
    with live_runtime(settings) as server:
        spans = InMemorySpanExporter()
        server.state.monitoring.tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0, timeout=60)
        num_requests, prompt_tokens, generated_tokens = short_load(client)
        traced = client.completions.create(
            model=MODEL, prompt="Hi", max_tokens=2, extra_headers={"traceparent": TRACEPARENT}
        )
        assert traced.usage is not None
        num_requests += 1
        prompt_tokens += traced.usage.prompt_tokens
        generated_tokens += traced.usage.completion_tokens
        invalid = httpx.post(
            f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": -1}
        )
        assert invalid.status_code == 400, invalid.text

        scrape = httpx.get(f"{server.url}/metrics")
        assert scrape.status_code == 200
        assert check_metrics(scrape.text) == []

        prom = prometheus_server([f"127.0.0.1:{server.port}"], scrape_interval="1s")
        prom.wait_for_scrape()
        missing = [
            name
            for name in CONTRACT_METRIC_NAMES
            if not prom.query(f"{name}_count" if name in HISTOGRAMS else name)
        ]
        assert missing == []

        # the operations guide's memory query, cpu form (no gpu type on CPU)
        fraction = prom.query('fastllm_memory_usage{type="cpu"} / fastllm_memory_total')
        assert [s.labels["type"] for s in fraction] == ["cpu"]
        assert 0.0 < fraction[0].value < 1.0

        mv = f'model="{MODEL}",version="stable"'
        assert prom.query(f"sum(fastllm_prompt_tokens_total{{{mv}}})")[0].value == prompt_tokens
        generated = prom.query(f"sum(fastllm_generation_tokens_total{{{mv}}})")
        assert generated[0].value == generated_tokens
        success = prom.query(f"sum(fastllm_request_success_total{{{mv}}})")
        assert success[0].value == num_requests
        failures = prom.query('sum(fastllm_request_failure_total{reason="validation"})')
        assert failures[0].value == 1
        others = prom.query('sum(fastllm_request_failure_total{reason!="validation"})')
        assert others[0].value == 0
        e2e = prom.query(f"sum(fastllm_e2e_request_latency_seconds_count{{{mv}}})")
        assert e2e[0].value == pytest.approx(num_requests)

    # the incoming W3C traceparent became the parent of that request's SERVER span
    server_spans = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert len(server_spans) == num_requests + 1  # the invalid request has its span too
    children = [s for s in server_spans if s.parent is not None]
    assert len(children) == 1 and children[0].parent is not None
    assert f"{children[0].context.trace_id:032x}" == TRACEPARENT.split("-")[1]
    assert f"{children[0].parent.span_id:016x}" == TRACEPARENT.split("-")[2]
