"""`fastllm serve` runs on jemalloc by default where Debian's libjemalloc2 is installed (CI
installs it): the served process maps the library, keeps its pid (a re-exec, not a child), and
`malloc=glibc` leaves it out."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from runtime.memory.host_malloc import find_jemalloc
from tests.fixtures.ready import fastllm_command, free_port, wait_ready


def _require_jemalloc() -> None:
    if find_jemalloc() is not None:
        return
    message = "libjemalloc.so.2 is not installed (apt-get install libjemalloc2)"
    if os.environ.get("FASTLLM_REQUIRE_BINARIES") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.mark.parametrize(("mode", "expected"), [("auto", True), ("glibc", False)])
def test_serve_maps_jemalloc_by_default(
    demo_model_dir: Callable[[str], Path], tmp_path: Path, mode: str, expected: bool
) -> None:
    _require_jemalloc()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    env.update(
        FASTLLM_DEVICE="cpu",
        FASTLLM_MODEL_NAME="llama",
        FASTLLM_STORAGE_ENABLED="false",
        FASTLLM_ALERTS_ENABLED="false",
        FASTLLM_MALLOC=mode,
    )
    env.pop("FASTLLM_MALLOC_REEXEC", None)
    cmd = [
        *fastllm_command(),
        "serve",
        "--model",
        str(demo_model_dir("llama")),
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(
        cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert wait_ready(f"http://127.0.0.1:{port}/ready", proc, timeout_s=120), "never ready"
        body = {"model": "llama", "prompt": "hi", "max_tokens": 2}
        response = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        maps = Path(f"/proc/{proc.pid}/maps").read_text()  # the same pid answered
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert ("libjemalloc" in maps) is expected, out
    assert ("malloc: jemalloc)" in out) is expected, out  # the "serving ..." line says which
