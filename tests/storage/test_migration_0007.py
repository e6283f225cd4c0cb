"""Migration 0007: per-request speculative decoding counts in inference_log."""

from __future__ import annotations

from datetime import datetime, timezone

from alembic import command
from sqlalchemy import Engine, inspect, select, text

from runtime.engine.stats import RequestStats
from storage.db import alembic_config, upgrade
from storage.models import InferenceLog
from storage.rows import request_row


def test_0007_adds_spec_counts_and_keeps_older_rows(engine: Engine) -> None:
    config = alembic_config(engine)
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0007-1")
    columns = {c["name"] for c in inspect(engine).get_columns("inference_log")}
    assert not columns & {"spec_draft_tokens", "spec_accepted_tokens"}
    ts = datetime.now(timezone.utc)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO inference_log (ts, request_id, model, version, status)"
                " VALUES (:ts, 'old', 'm', 'v', 'stop')"
            ),
            {"ts": ts.replace(tzinfo=None)},
        )
    upgrade(engine)
    cols = (InferenceLog.spec_draft_tokens, InferenceLog.spec_accepted_tokens)
    drafted = RequestStats("new", "m", finished_ts=ts.timestamp())
    drafted.spec_draft_tokens, drafted.spec_accepted_tokens = 40, 31
    plain = RequestStats("plain", "m", finished_ts=ts.timestamp())
    with engine.begin() as conn:
        assert tuple(conn.execute(select(*cols)).one()) == (None, None)
        conn.execute(InferenceLog.__table__.insert(), [request_row(drafted), request_row(plain)])
        by_id = {
            r.request_id: (r.spec_draft_tokens, r.spec_accepted_tokens)
            for r in conn.execute(select(InferenceLog.request_id, *cols))
        }
    assert by_id["new"] == (40, 31)
    assert by_id["plain"] == (None, None)  # nothing drafted: NULL, not 0
