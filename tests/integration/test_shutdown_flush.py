"""Issue 7's shutdown flush with the real CLI: `fastllm serve` in a subprocess on the tiny demo
model and a SQLite file; N requests, then SIGTERM at once (rows may still be queued in the
writer) -> the process exits 0 and `inference_log` holds exactly one row per request. The rows are
counted with the stdlib sqlite3 module, not through our storage code."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.fixtures.ready import fastllm_command, start_on_free_port

NUM_REQUESTS = 8


def _complete(url: str, k: int) -> str:
    body = {"model": "llama", "prompt": f"request number {k}", "max_tokens": 4 + k % 5}
    if k % 2:
        body["stream"] = True
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60.0) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line.startswith("data: {")]
        return str(json.loads(lines[0].removeprefix("data: "))["id"])
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60.0)
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


def test_sigterm_flushes_every_row(demo_model_dir: Callable[[str], Path], tmp_path: Path) -> None:
    db = tmp_path / "fastllm.db"
    env = dict(os.environ)
    env.update(
        FASTLLM_DATABASE_URL=f"sqlite:///{db}",
        FASTLLM_VERIFY_SAMPLE_RATE="0",
        FASTLLM_DEVICE="cpu",
        FASTLLM_MODEL_NAME="llama",
        FASTLLM_DRAIN_GRACE_S="10",
    )
    model = str(demo_model_dir("llama"))
    log_path = tmp_path / "serve.log"
    process, port = start_on_free_port(
        lambda port: [*fastllm_command(), "serve", "--model", model, "--port", str(port)],
        log_path,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with ThreadPoolExecutor(4) as pool:
            ids = list(pool.map(lambda k: _complete(url, k), range(NUM_REQUESTS)))
        process.send_signal(signal.SIGTERM)  # at once: the writer may still hold queued rows
        rc = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert rc == 0, log_path.read_text(errors="replace")[-3000:]

    with sqlite3.connect(db) as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM inference_log").fetchone()
        logged = {row[0] for row in conn.execute("SELECT request_id FROM inference_log")}
    assert count == NUM_REQUESTS
    assert logged == set(ids)
