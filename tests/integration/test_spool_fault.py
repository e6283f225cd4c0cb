"""Finding 3 of issue 17 with the real CLI: `fastllm serve` on a SQLite file that another process
holds locked (the database unwritable), 500 requests, SIGTERM; then the database writable again
and a restart: exactly 500 rows, none dropped. The rows are counted with the stdlib sqlite3
module, not through our storage code."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.fixtures.ready import fastllm_command, free_port, wait_ready

NUM_REQUESTS = 500
CLOSED = re.compile(r"closed: (\d+) rows written, (\d+) spilled.*, (\d+) dropped")


@contextmanager
def serving(model: Path, db: Path, log_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    env = {
        **os.environ,
        "FASTLLM_DATABASE_URL": f"sqlite:///{db}",
        "FASTLLM_VERIFY_SAMPLE_RATE": "0",
        "FASTLLM_ALERTS_ENABLED": "false",
        "FASTLLM_TRACING_ENABLED": "false",  # not what this test is about; spares CPU
        # nor is the batch policy: its load-time sweep (batch sizes 1..64) was most of each
        # start's 19-26 s on a loaded machine, and the test starts the server twice
        "FASTLLM_BATCH_WARMUP": "false",
        "FASTLLM_DEVICE": "cpu",
        "FASTLLM_MODEL_NAME": "llama",
        "FASTLLM_LOG_CLOSE_TIMEOUT_S": "1",
        "FASTLLM_MAX_QUEUED_REQUESTS": "1024",
    }
    command = [*fastllm_command(), "serve", "--model", str(model), "--port", str(port)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_ready(f"{url}/ready", proc, 180.0), log_path.read_text(errors="replace")
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def stop(proc: subprocess.Popen[bytes], log_path: Path) -> tuple[int, int, int]:
    """SIGTERM; exit 0; the writer's shutdown line: (written, spilled, dropped)."""
    proc.send_signal(signal.SIGTERM)
    text = ""
    try:
        assert proc.wait(timeout=120) == 0
    finally:
        text = log_path.read_text(errors="replace")
    found = CLOSED.search(text)
    assert found, text[-3000:]
    written, spilled, dropped = map(int, found.groups())
    return written, spilled, dropped


def count(db: Path) -> tuple[int, int]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT COUNT(*), COUNT(DISTINCT request_id) FROM inference_log"
        ).fetchone()


def has_table(db: Path) -> bool:
    with sqlite3.connect(db) as conn:
        found = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'inference_log'"
        ).fetchone()
    return found is not None


def metric(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name) and not line.startswith(f"{name}_created"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.slow  # a server process (twice), hundreds of requests
def test_rows_queued_while_the_database_is_locked_survive_a_restart(
    demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    db, model = tmp_path / "fastllm.db", demo_model_dir("llama")
    with serving(model, db, tmp_path / "first.log") as (url, proc):
        # the writer's drain thread migrates the file in the background: lock it once the table
        # is there (a server ready within ~2 s was locked before it, and no table was made)
        deadline = time.monotonic() + 60
        while not has_table(db):
            assert time.monotonic() < deadline, "the server never created inference_log"
            time.sleep(0.05)
        locker = sqlite3.connect(db, isolation_level=None, timeout=60)
        locker.execute("BEGIN EXCLUSIVE")  # from here on, every write of the server waits, fails
        try:
            body = {"model": "llama", "prompt": "the quick brown fox", "max_tokens": 1}
            with httpx.Client(timeout=60) as client, ThreadPoolExecutor(4) as pool:
                responses = list(
                    pool.map(lambda _: client.post(f"{url}/v1/completions", json=body), range(500))
                )
            assert [r.status_code for r in responses] == [200] * NUM_REQUESTS
            ids = {r.json()["id"] for r in responses}
            deadline = time.monotonic() + 30  # the last rows reach the queue a step later
            while metric(url, "fastllm_inference_log_queue_rows") < NUM_REQUESTS - 256:
                assert time.monotonic() < deadline, "the queue gauge never showed the rows"
                time.sleep(0.1)
            written, spilled, dropped = stop(proc, tmp_path / "first.log")
        finally:
            locker.execute("ROLLBACK")
            locker.close()
    assert (written, spilled, dropped) == (0, NUM_REQUESTS, 0)
    assert count(db) == (0, 0)

    with serving(model, db, tmp_path / "second.log") as (url, proc):
        deadline = time.monotonic() + 60
        while count(db)[0] < NUM_REQUESTS:  # the spool is written at start, before new rows
            assert time.monotonic() < deadline, f"only {count(db)} rows after the restart"
            time.sleep(0.1)
        assert metric(url, "fastllm_inference_log_dropped_total") == 0
        written, spilled, dropped = stop(proc, tmp_path / "second.log")
    assert (written, spilled, dropped) == (NUM_REQUESTS, 0, 0)
    assert count(db) == (NUM_REQUESTS, NUM_REQUESTS)
    with sqlite3.connect(db) as conn:
        assert {r for (r,) in conn.execute("SELECT request_id FROM inference_log")} == ids
    assert sorted(p.name for p in tmp_path.glob("fastllm.db.spool*")) == [
        "fastllm.db.spool.jsonl.lock"
    ]
