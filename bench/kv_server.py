"""`fastllm serve` in a subprocess for bench.kv, and the prefix-cache hit rate from its /metrics."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families


@contextmanager
def serve(
    model: Path,
    device: str,
    *,
    prefix_caching: bool,
    name: str | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """The server's base URL while it runs; metrics on, everything else around it off. `name`:
    the model name it serves (default: the directory's); `env`: more FASTLLM_* settings."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "FASTLLM_DEVICE": device,
        "FASTLLM_ENABLE_PREFIX_CACHING": str(prefix_caching).lower(),
        "FASTLLM_METRICS_ENABLED": "true",
        "FASTLLM_TRACING_ENABLED": "false",
        "FASTLLM_STORAGE_ENABLED": "false",
        "FASTLLM_ALERTS_ENABLED": "false",
        **({"FASTLLM_MODEL_NAME": name} if name else {}),
        **(env or {}),
    }
    cmd = [sys.executable, "-m", "runtime", "serve", "--model", str(model), "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                if httpx.get(f"{url}/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become ready")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


def hit_rate(metrics_text: str) -> float:
    """fastllm_prefix_cache_hits_total / fastllm_prefix_cache_queries_total, every series summed."""
    totals = {"fastllm_prefix_cache_hits": 0.0, "fastllm_prefix_cache_queries": 0.0}
    for family in text_string_to_metric_families(metrics_text):
        if family.name in totals:
            totals[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    queries = totals["fastllm_prefix_cache_queries"]
    return totals["fastllm_prefix_cache_hits"] / queries if queries else 0.0
