"""`fastllm serve` in a subprocess: SIGTERM drains in-flight streams, refuses new work, exits 0."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.fixtures.ready import fastllm_command, start_on_free_port

NUM_IN_FLIGHT = 3


def _stream(url: str, started: threading.Barrier) -> tuple[int, list[str]]:
    body = {
        "model": "llama-tiny",
        "prompt": "once upon a time",
        # long enough that the streams still run while the test checks /ready and the refusal:
        # 60 tokens were all drained before those checks on a loaded machine (connection refused)
        "max_tokens": 400,
        "ignore_eos": True,  # the random model may draw eos early: run every stream to the end
        "stream": True,
    }
    lines: list[str] = []
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                lines.append(line)
                if len(lines) == 1:
                    started.wait(60)
    return response.status_code, lines


def test_sigterm_drains_then_exits_zero(
    demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    model = tmp_path / "llama-tiny"
    model.symlink_to(demo_model_dir("llama"), target_is_directory=True)
    env = {
        **os.environ,
        "FASTLLM_STORAGE_ENABLED": "false",
        "FASTLLM_ALERTS_ENABLED": "false",
        "FASTLLM_DEVICE": "cpu",
        "FASTLLM_DRAIN_GRACE_S": "120",
    }
    log_path = tmp_path / "serve.log"
    proc, port = start_on_free_port(
        lambda port: [*fastllm_command(), "serve", "--model", str(model), "--port", str(port)],
        log_path,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        started = threading.Barrier(NUM_IN_FLIGHT + 1)
        with ThreadPoolExecutor(NUM_IN_FLIGHT) as pool:
            streams = [
                pool.submit(_stream, f"{base}/v1/completions", started)
                for _ in range(NUM_IN_FLIGHT)
            ]
            started.wait(60)  # every stream has its first token: all are in flight
            proc.send_signal(signal.SIGTERM)
            while httpx.get(f"{base}/ready").status_code != 503:
                time.sleep(0.01)
            refused = httpx.post(
                f"{base}/v1/completions",
                json={"model": "llama-tiny", "prompt": "x", "max_tokens": 2},
            )
            assert refused.status_code == 503 and "Retry-After" in refused.headers
            results = [stream.result(120) for stream in streams]
        for status, lines in results:
            assert status == 200
            assert lines[-1] == "data: [DONE]"
            assert '"finish_reason":"length"' in lines[-2]  # ran to max_tokens, not cut off
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
