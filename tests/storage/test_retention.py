from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine, insert, select

from storage.models import AlertEvent, InferenceLog, MetricSample, StoredResponse
from storage.retention import prune


def test_prune_deletes_only_rows_older_than_retention(engine: Engine) -> None:
    now = datetime.now(timezone.utc)
    ages_days = [45, 40, 31, 29, 1, 0, 35, 60, 2, 50]  # 6 older than 30 days
    with engine.begin() as conn:
        for i, age in enumerate(ages_days):
            ts = now - timedelta(days=age)
            conn.execute(
                insert(InferenceLog),
                [{"ts": ts, "request_id": f"r{i}", "model": "m", "version": "v", "status": "stop"}],
            )
            conn.execute(
                insert(MetricSample), [{"ts": ts, "name": "x", "labels": "{}", "value": i}]
            )
            conn.execute(
                insert(AlertEvent),
                [
                    {
                        "ts": ts,
                        "alertname": "A",
                        "state": "firing",
                        "labels": "{}",
                        "annotations": "{}",
                        "fingerprint": f"f{i}",
                    }
                ],
            )
            stored = {"ts": ts, "response_id": f"resp_{i}", "tenant": "", "model": "m"}
            conn.execute(insert(StoredResponse), [{**stored, "response": "{}", "turns": "[]"}])
    num_old = sum(age > 30 for age in ages_days)
    deleted = prune(engine, retention_days=30, batch_size=4, now=now)  # several batches
    assert deleted == {
        "inference_log": num_old,
        "metric_samples": num_old,
        "alert_events": num_old,
        "stored_responses": num_old,
    }
    with engine.connect() as conn:
        kept = sorted(conn.execute(select(InferenceLog.request_id)).scalars())
        assert kept == sorted(f"r{i}" for i, age in enumerate(ages_days) if age <= 30)
        assert len(conn.execute(select(MetricSample.id)).all()) == len(ages_days) - num_old
    assert prune(engine, retention_days=30, batch_size=4, now=now)["inference_log"] == 0


def test_prune_rejects_nonsense(engine: Engine) -> None:
    with pytest.raises(ValueError):
        prune(engine, retention_days=0)
    with pytest.raises(ValueError):
        prune(engine, retention_days=1, batch_size=0)


def test_cli_db_prune(engine: Engine, db_url: str) -> None:
    from click.testing import CliRunner

    from runtime.cli import cli

    old = datetime.now(timezone.utc) - timedelta(days=10)
    with engine.begin() as conn:
        conn.execute(
            insert(InferenceLog),
            [
                {"ts": ts, "request_id": rid, "model": "m", "version": "v", "status": "stop"}
                for ts, rid in ((old, "old"), (datetime.now(timezone.utc), "new"))
            ],
        )
    args = ["db", "prune", "--database-url", db_url, "--retention-days", "7", "--batch-size", "1"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "inference_log: 1 rows deleted" in result.output
    with engine.connect() as conn:
        assert list(conn.execute(select(InferenceLog.request_id)).scalars()) == ["new"]
