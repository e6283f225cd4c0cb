"""`fastllm serve` in a subprocess: SIGTERM while a grammar compiles for long exits within
`drain_grace_s` (issue 39: the process stayed at 100% CPU, the compile going on), and the compile's
worker process goes with it."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from tests.fixtures.ready import fastllm_command, start_on_free_port

ROOT = Path(__file__).resolve().parents[3]
GRACE_S = 3.0
LONG = "." * 40_000  # tens of seconds to compile on the demo vocabulary (past every bound here)


def test_sigterm_during_a_long_compile_exits_within_the_grace(
    demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    model = tmp_path / "llama-tiny"
    model.symlink_to(demo_model_dir("llama"), target_is_directory=True)
    env = {
        **os.environ,
        "FASTLLM_STORAGE_ENABLED": "false",
        "FASTLLM_ALERTS_ENABLED": "false",
        "FASTLLM_DEVICE": "cpu",
        "FASTLLM_DRAIN_GRACE_S": str(GRACE_S),
        "FASTLLM_GRAMMAR_COMPILE_TIMEOUT_S": "600",  # only the shutdown may stop it
        "FASTLLM_GRAMMAR_MAX_REGEX_CHARS": "100000",
        # this checkout's code, not the one the console script's install points at
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc, port = start_on_free_port(
        lambda port: [*fastllm_command(), "serve", "--model", str(model), "--port", str(port)],
        tmp_path / "serve.log",
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    server = psutil.Process(proc.pid)
    try:
        warm = {"model": "llama-tiny", "prompt": "x", "max_tokens": 2, "guided_regex": "ab"}
        assert httpx.post(f"{base}/v1/completions", json=warm, timeout=120).status_code == 200
        workers = [p for p in server.children(recursive=True) if p.cpu_percent() is not None]
        body = {"model": "llama-tiny", "prompt": "x", "max_tokens": 2, "guided_regex": LONG}
        threading.Thread(
            target=lambda: httpx.post(f"{base}/v1/completions", json=body, timeout=120),
            daemon=True,
        ).start()
        busy = _wait_busy(workers)
        assert busy is not None, "no worker took the compile"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(GRACE_S + 10)  # the grace, plus the rest of a shutdown
        assert time.monotonic() - t0 < GRACE_S + 10
        deadline = time.monotonic() + 5
        while busy.is_running() and busy.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the compile's worker outlived the server"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _wait_busy(workers: list[psutil.Process]) -> psutil.Process | None:
    """The child that burns CPU once the long compile has reached it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for worker in workers:
            try:
                if worker.cpu_percent(interval=None) > 50:
                    return worker
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.2)
    return None
