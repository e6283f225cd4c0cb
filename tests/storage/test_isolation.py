"""Finding 2 of issue 17: one row the database cannot store (a lone surrogate in its text) must not
take the other rows of its batch with it. On both databases the batch is written row by row: the
good rows are stored, the bad one is counted as dropped ("unstorable") and logged by request id."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from sqlalchemy import Engine, select

from storage.models import InferenceLog
from storage.writer import InferenceLogWriter
from tests.storage.factories import probe, request_stats


def _ids(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        query = select(InferenceLog.request_id).order_by(InferenceLog.id)
        return list(conn.execute(query).scalars())


def test_one_unstorable_row_costs_only_itself(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    drops: list[tuple[int, str]] = []
    writer = InferenceLogWriter(
        engine,
        batch_size=64,
        migrate=False,
        autostart=False,  # all 21 rows queued first: they go out as one batch
        on_drop=lambda n, reason: drops.append((n, reason)),
    )
    bad = dataclasses.replace(request_stats(10), request_id="req-bad", model="\ud800")
    for i in range(20):
        writer.record(finished=[request_stats(i)])
        if i == 9:
            writer.record(finished=[bad])
    writer.record(verified=[probe(3, "logit", 1.0, 1.5), probe(4, "geglu", 0.5, 0.5)])
    with caplog.at_level(logging.WARNING, logger="storage.drain"):
        writer.start()
        assert writer.close(timeout=30) is False  # one row was dropped
    assert sorted(_ids(engine)) == sorted([f"req-{i}" for i in range(20)] + ["req-4"])
    assert drops == [(1, "unstorable")]
    assert writer.num_dropped_by_reason == {"unstorable": 1}
    assert any("'req-bad'" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    with engine.connect() as conn:
        merged = conn.execute(
            select(InferenceLog.op, InferenceLog.expected).where(InferenceLog.request_id == "req-3")
        ).one()
    assert tuple(merged) == ("logit", 1.5)  # the logit probe of the same batch still merged


def test_good_batches_are_not_split(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    writer = InferenceLogWriter(engine, batch_size=64, migrate=False, autostart=False)
    writer.record(finished=[request_stats(i) for i in range(30)])
    with caplog.at_level(logging.WARNING, logger="storage.drain"):
        writer.start()
        assert writer.close(timeout=30)
    assert len(_ids(engine)) == 30 and writer.num_dropped == 0
    assert not [r for r in caplog.records if "row by row" in r.getMessage()]
