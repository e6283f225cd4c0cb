"""Issue 6 against a live runtime: the real server (wired as `fastllm serve` wires it) serves a
short load; promtool lints its /metrics, a real Prometheus scrapes it every second, and the
counters equal what the responses' `usage` says (the openai client reads those, not our code)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from monitoring.metrics import CONTRACT_METRIC_NAMES
from tests.fixtures.prometheus import PromHandle, check_metrics
from tests.integration.support import MODEL, live_runtime, runtime_settings

HISTOGRAMS = {
    "fastllm_batch_size",
    "fastllm_time_to_first_token_seconds",
    "fastllm_time_per_output_token_seconds",
    "fastllm_e2e_request_latency_seconds",
    "fastllm_request_queue_seconds",
}


def short_load(client: openai.OpenAI) -> tuple[int, int, int]:
    """Completions and chats, plain and streamed; returns (requests, prompt, generated) tokens
    as the responses report them."""
    usages = []
    for max_tokens in (3, 7):
        result = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=max_tokens)
        usages.append(result.usage)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5
    )
    usages.append(chat.usage)
    options = {"include_usage": True}
    stream = client.completions.create(
        model=MODEL, prompt="Once", max_tokens=6, stream=True, stream_options=options
    )
    usages.append([c.usage for c in stream if c.usage is not None][-1])
    chat_stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count"}],
        max_tokens=4,
        stream=True,
        stream_options=options,
    )
    usages.append([c.usage for c in chat_stream if c.usage is not None][-1])
    assert all(u is not None for u in usages)
    prompt = sum(u.prompt_tokens for u in usages)
    generated = sum(u.completion_tokens for u in usages)
    return len(usages), prompt, generated


def test_live_runtime_scrape(
    demo_model_dir: Callable[[str], Path], prometheus_server: Callable[..., PromHandle]
) -> None:
    settings = runtime_settings(demo_model_dir("llama"))
    with live_runtime(settings) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0, timeout=60)
        num_requests, prompt_tokens, generated_tokens = short_load(client)
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
        assert prom.query(f"fastllm_prompt_tokens_total{{{mv}}}")[0].value == prompt_tokens
        assert prom.query(f"fastllm_generation_tokens_total{{{mv}}}")[0].value == generated_tokens
        success = prom.query(f"sum(fastllm_request_success_total{{{mv}}})")
        assert success[0].value == num_requests
        failures = prom.query('sum(fastllm_request_failure_total{reason="validation"})')
        assert failures[0].value == 1
        others = prom.query('sum(fastllm_request_failure_total{reason!="validation"})')
        assert others[0].value == 0
        e2e = prom.query(f"fastllm_e2e_request_latency_seconds_count{{{mv}}}")
        assert e2e[0].value == pytest.approx(num_requests)
