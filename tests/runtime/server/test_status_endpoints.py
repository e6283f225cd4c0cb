"""The status page counts requests per endpoint (issue 38): after one request to each of
/v1/completions, /v1/chat/completions, /v1/responses and /v1/messages, the page's own panel
("Requests per endpoint", from the overview dashboard) answers one request for each, from the
embedded evaluator's samples, and the scrape's request counters carry the same `endpoint`
labels."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.server.wiring import build_state
from tests.runtime.server.live import API_KEY, LiveServer, light_settings

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BODIES: dict[str, dict[str, Any]] = {
    "completions": {"model": "llama", "prompt": "hi", "max_tokens": 2},
    "chat/completions": CHAT,
    "responses": {"model": "llama", "input": "hi", "max_output_tokens": 2},
    "messages": CHAT,
}
ENDPOINTS = {"completions", "chat", "responses", "messages"}


@pytest.fixture(scope="module")
def server(demo_model_dir: Callable[[str], Path]) -> Iterator[LiveServer]:
    settings = light_settings(
        model_path=demo_model_dir("llama"),
        model_name="llama",
        alerts_enabled=True,
        alerts_interval_s=3600.0,  # one round at start; the test ticks it itself
    )
    live = LiveServer(build_state(settings)).start()
    try:
        for path, body in BODIES.items():
            reply = httpx.post(f"{live.url}/v1/{path}", json=body, headers=AUTH, timeout=60)
            assert reply.status_code == 200, reply.text
        yield live
    finally:
        live.stop()


def _served(text: str) -> dict[str, float]:
    """Successful requests per endpoint in a scrape."""
    out: dict[str, float] = {}
    for row in text.splitlines():
        if row.startswith("fastllm_request_success_total{"):
            endpoint = re.search(r'endpoint="(\w+)"', row)
            assert endpoint is not None, row
            out[endpoint[1]] = out.get(endpoint[1], 0.0) + float(row.split()[-1])
    return out


def test_the_page_counts_requests_per_endpoint(server: LiveServer) -> None:
    deadline = time.monotonic() + 30
    while True:  # stats reach the metrics one engine-loop turn after each response
        served = _served(httpx.get(f"{server.url}/metrics", timeout=30).text)
        if all(served.get(e) == 1.0 for e in ENDPOINTS):
            break
        assert time.monotonic() < deadline, served
        time.sleep(0.05)
    assert served == {e: 1.0 for e in ENDPOINTS} | {"embeddings": 0.0, "other": 0.0}
    server.state.alerts.tick()  # a round with the counters in the page's store
    panels = httpx.get(f"{server.url}/status/api/panels", headers=AUTH, timeout=30).json()
    [panel] = [p for p in panels["panels"] if p["title"] == "Requests per endpoint"]
    assert panel["problem"] is None
    [target] = panel["targets"]
    reply = httpx.get(
        f"{server.url}/api/v1/query", params={"query": target["expr"]}, headers=AUTH, timeout=30
    ).json()
    assert reply["status"] == "success", reply
    counts = {s["metric"]["endpoint"]: float(s["value"][1]) for s in reply["data"]["result"]}
    # increase() over the page's window extrapolates from the samples it has: a count of one
    # request reads at least one wherever one was served, zero elsewhere
    assert {e for e, n in counts.items() if n >= 1.0} == ENDPOINTS
    assert all(counts[e] == 0.0 for e in set(counts) - ENDPOINTS)
