"""Issue 29's unbounded queries against the real CLI (`fastllm serve`, the embedded evaluator
sampling every second): the backtracking regex that pinned the CPU and took SIGTERM with it, and
a query heavy by size, which now ends at `query_timeout_s`. Meanwhile /health answers each probe
within a second, and SIGTERM during the query exits 0 within the drain grace. Every wait is
bounded by a deadline; none asserts how fast anything was."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.ready import fastllm_command, start_on_free_port

GRACE_S = 5.0
MARGIN_S = 30.0
NUM_PROBES = 5
# the finding: Python's re backtracks 2^len over a metric name (~40 characters); never ends
BACKTRACKING = '{__name__=~"(\\\\w|\\\\w)*!"}'
# heavy by size: 11,000 steps, each over every sampled series
HEAVY = 'sum(count_over_time({__name__=~".+"}[1h]))'


@contextmanager
def _serve(
    model: Path, tmp_path: Path, **settings: str
) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    env = {
        **os.environ,
        "FASTLLM_STORAGE_ENABLED": "false",
        "FASTLLM_TRACING_ENABLED": "false",
        "FASTLLM_DEVICE": "cpu",
        "FASTLLM_ALERTS_INTERVAL_S": "1",
        "FASTLLM_DRAIN_GRACE_S": str(GRACE_S),
        **{f"FASTLLM_{k.upper()}": v for k, v in settings.items()},
    }
    log_path = tmp_path / "serve.log"
    proc, port = start_on_free_port(
        lambda p: [*fastllm_command(), "serve", "--model", str(model), "--port", str(p)],
        log_path,
        env=env,
    )
    try:
        yield proc, f"http://127.0.0.1:{port}", log_path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _wait_for_samples(base: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        reply = httpx.get(f"{base}/api/v1/query", params={"query": "fastllm_batch_size_limit"})
        if reply.status_code == 200 and reply.json()["data"]["result"]:
            return
        time.sleep(0.5)
    raise AssertionError("the evaluator stored no samples")


class _Query(threading.Thread):
    """One query in the background; `reply` once answered, `error` if the connection failed."""

    def __init__(self, url: str, params: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.url, self.params = url, params
        self.reply: httpx.Response | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            self.reply = httpx.get(self.url, params=self.params, timeout=MARGIN_S + 60)
        except httpx.HTTPError as exc:
            self.error = exc


def _health_answers(base: str) -> list[Any]:
    """Each probe's status, or the exception of one not answered within a second."""
    answers: list[Any] = []
    for _ in range(NUM_PROBES):
        try:
            answers.append(httpx.get(f"{base}/health", timeout=1.0).status_code)
        except httpx.HTTPError as exc:
            answers.append(type(exc).__name__)
        time.sleep(0.2)
    return answers


def _sigterm_exits_within_grace(proc: subprocess.Popen[bytes], log_path: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=GRACE_S + MARGIN_S)
    except subprocess.TimeoutExpired:
        rc = None
    text = log_path.read_text(errors="replace")
    assert rc == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


@pytest.mark.slow  # a server process
def test_unbounded_queries_leave_health_working_end_at_the_deadline_and_sigterm_exits(
    demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """Both findings against one server (a start of `fastllm serve` is most of this test's CPU;
    these were two tests, a server each): the backtracking regex, then the heavy query, /health
    answering throughout, and SIGTERM during a heavy query exits within the grace."""
    # the heavy query takes ~0.5 s on an idle 2-core machine (longer under load): a deadline
    # well under that ends it by the deadline on any machine
    timeout_s = 0.2
    settings = {"query_timeout_s": str(timeout_s), "query_max_samples": str(10**8)}
    with _serve(demo_model_dir("llama"), tmp_path, **settings) as (proc, base, log_path):
        _wait_for_samples(base)
        # the backtracking regex: answered (RE2 matches in linear time; a 503 past the deadline
        # is an answer too), and /health meanwhile
        query = _Query(f"{base}/api/v1/query", {"query": BACKTRACKING})
        query.start()
        time.sleep(0.3)  # let it start
        assert _health_answers(base) == [200] * NUM_PROBES
        query.join(timeout=timeout_s + MARGIN_S)
        assert query.reply is not None, query.error
        assert query.reply.status_code in (200, 503), query.reply.text[:300]

        # heavy by size: ends at its deadline, /health meanwhile
        now = time.time()
        params = {"query": HEAVY, "start": str(now - 1100), "end": str(now), "step": "0.1"}
        query = _Query(f"{base}/api/v1/query_range", params)
        query.start()
        time.sleep(0.3)
        assert _health_answers(base) == [200] * NUM_PROBES
        query.join(timeout=timeout_s + MARGIN_S)
        assert query.reply is not None, query.error
        assert query.reply.status_code == 503, query.reply.text[:300]
        body = query.reply.json()
        assert body["status"] == "error" and body["errorType"] == "timeout"
        assert "query_timeout_s" in body["error"]
        during = _Query(f"{base}/api/v1/query_range", params)
        during.start()
        time.sleep(0.05)  # inside its 0.2 s
        _sigterm_exits_within_grace(proc, log_path)
