"""Issue 29, item 4: with the database down, the evaluator logs the outage once when it starts
(and when the error changes) and once when it ends, never a traceback per round."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy.exc import OperationalError

from tests.alerts.test_evaluator import _setup


def test_a_database_outage_is_logged_once_per_state_change(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, evaluator, _, _ = _setup()
    down = OperationalError("INSERT", {}, Exception("connection refused\nDETAIL: more"))
    outcome: list[BaseException | None] = [down] * 5 + [RuntimeError("disk full")] * 2 + [None]
    real_append = evaluator.store.append

    def append(*args: object) -> None:
        exc = outcome.pop(0) if outcome else None
        if exc is not None:
            raise exc
        real_append(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(evaluator.store, "append", append)
    caplog.set_level(logging.INFO, logger="alerts.evaluator")
    for _ in range(9):
        evaluator._safe_tick()
    records = [r for r in caplog.records if r.name == "alerts.evaluator"]
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    assert [r.getMessage().split(": ", 1)[1] for r in warnings] == [
        "OperationalError: (builtins.Exception) connection refused (logged again when it changes)",
        "RuntimeError: disk full (logged again when it changes)",
    ]
    assert all(r.exc_info is None for r in warnings)  # no traceback at WARNING
    recovered = [r.getMessage() for r in records if "recovered" in r.getMessage()]
    assert recovered == ["alert evaluation recovered after 7 failed rounds"]
