"""Shared fixtures. Heavy fixtures live in tests/fixtures/ and are registered here as plugins."""

from __future__ import annotations

import os
import shutil

import pytest

pytest_plugins: list[str] = []


def require_binary(name: str, *candidates: str) -> str:
    """Path of an external binary, or skip with a reason; in CI (FASTLLM_REQUIRE_BINARIES=1)
    a missing binary is a failure, so a skip can never hide one there."""
    for candidate in (name, *candidates):
        path = candidate if os.path.isabs(candidate) and os.path.exists(candidate) else None
        path = path or shutil.which(candidate)
        if path:
            return path
    message = f"{name} is not installed (apt-get install the package that provides it)"
    if os.environ.get("FASTLLM_REQUIRE_BINARIES") == "1":
        pytest.fail(message)
    pytest.skip(message)
    raise AssertionError("unreachable")
