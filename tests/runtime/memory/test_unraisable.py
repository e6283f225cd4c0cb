"""No warning filter hides an exception raised in a handle's `__del__`: pytest reports it as a
PytestUnraisableExceptionWarning, which this project's `filterwarnings = error` turns into a
failure. Checked by running a small test file under the project's own pytest configuration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
INNER = """
from collections import deque

from runtime.memory import Allocator


class Broken(deque):
    def append(self, item):  # the allocator's dropped-handle list, failing
        raise RuntimeError("broken dropped list")


def test_drop_unreleased_{kind}():
    alloc = Allocator(device="cpu")
    block = alloc.alloc((4,), dtype=__import__("torch").float32, owner="t")
    handle = {make}
    alloc._dropped = Broken()
    del handle, block  # __del__ of a live handle appends to _dropped: raises
"""


@pytest.mark.parametrize(("kind", "make"), [("block", "block"), ("view", "block.view(2, 2)")])
def test_an_exception_in_del_fails_the_test(tmp_path: Path, kind: str, make: str) -> None:
    inner = tmp_path / f"test_inner_{kind}.py"
    inner.write_text(INNER.format(kind=kind, make=make))
    pytest_args = ["-q", "-p", "no:cacheprovider", "-c", "pyproject.toml", "--rootdir", str(ROOT)]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, str(inner)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "PytestUnraisableExceptionWarning" in out and "broken dropped list" in out, out
