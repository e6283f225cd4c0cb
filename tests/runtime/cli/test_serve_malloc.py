"""`fastllm serve` runs on jemalloc by default where Debian's libjemalloc2 is installed (CI
installs it): the served process maps the library, keeps its pid (a re-exec, not a child), and
`malloc=glibc` leaves it out."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.memory.host_malloc import find_jemalloc
from tests.fixtures.ready import serve_llama_once


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
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    env.update(
        FASTLLM_DEVICE="cpu",
        FASTLLM_MODEL_NAME="llama",
        FASTLLM_STORAGE_ENABLED="false",
        FASTLLM_ALERTS_ENABLED="false",
        FASTLLM_MALLOC=mode,
    )
    env.pop("FASTLLM_MALLOC_REEXEC", None)
    with serve_llama_once(demo_model_dir("llama"), env, tmp_path) as served:
        maps = Path(f"/proc/{served.proc.pid}/maps").read_text()  # the same pid answered
    out = served.output
    assert ("libjemalloc" in maps) is expected, out
    assert ("malloc: jemalloc)" in out) is expected, out  # the "serving ..." line says which
