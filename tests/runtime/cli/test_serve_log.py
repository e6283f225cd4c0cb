"""`fastllm serve` on its embedded defaults (SQLite, alert evaluator) logs one line per startup
phase at INFO: no alembic plugin lines, no scheduler heartbeat; debug brings them back."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runtime.cli.serve import QUIET_AT_INFO, configure_logging
from tests.fixtures.ready import serve_llama_once


def test_startup_log_at_info_is_one_line_per_phase(
    demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "FASTLLM_DATABASE_URL": f"sqlite:///{tmp_path / 'fastllm.db'}",
        "FASTLLM_DEVICE": "cpu",
        "FASTLLM_MODEL_NAME": "llama",
        "FASTLLM_ALERTS_INTERVAL_S": "1",  # several evaluator ticks while the server runs
    }
    with serve_llama_once(demo_model_dir("llama"), env, tmp_path) as served:
        pass
    out = served.output
    lines = out.splitlines()
    first_request = next(i for i, line in enumerate(lines) if "POST /v1/completions" in line)
    access = ' HTTP/1.1" '  # uvicorn's access lines (the readiness polls among them)
    # INFO lines only: a WARNING (e.g. the evaluator falling behind on a loaded machine) is news
    startup = [
        line for line in lines[:first_request] if access not in line and "WARNING" not in line
    ]
    assert len(startup) < 10, "\n".join(startup)
    text = "\n".join(lines)
    for phase in ("migrations applied", "loaded in", "alert evaluator started", "running on"):
        assert phase in text, f"no {phase!r} line:\n{text}"
    chatter = [line for line in lines if line.startswith(("INFO alembic", "INFO apscheduler"))]
    assert not chatter, text


@pytest.fixture
def restore_levels() -> Iterator[None]:
    saved = {name: logging.getLogger(name).level for name in QUIET_AT_INFO}
    root = logging.getLogger().level
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)
    logging.getLogger().setLevel(root)


@pytest.mark.parametrize(("level", "quiet"), [("info", True), ("debug", False)])
def test_library_chatter_hidden_at_info_only(restore_levels: None, level: str, quiet: bool) -> None:
    configure_logging(level)
    for name in QUIET_AT_INFO:
        assert logging.getLogger(name).isEnabledFor(logging.INFO) is not quiet
