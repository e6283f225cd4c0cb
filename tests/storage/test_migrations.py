from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner
from sqlalchemy import Engine, event, inspect, select, text

from runtime.cli import cli
from storage.db import alembic_config, current_revision, head_revision, make_engine, upgrade
from storage.models import Base, InferenceLog


def test_migrations_create_tables_and_indexes(engine: Engine) -> None:
    insp = inspect(engine)
    assert {"inference_log", "metric_samples", "alert_events"} <= set(insp.get_table_names())
    indexed = {
        table: {tuple(ix["column_names"]) for ix in insp.get_indexes(table)}
        for table in ("inference_log", "metric_samples", "alert_events")
    }
    assert {("ts",), ("op",)} <= indexed["inference_log"]
    assert ("name", "ts") in indexed["metric_samples"]
    assert ("alertname", "ts") in indexed["alert_events"]
    assert current_revision(engine) == head_revision()


def test_migrations_match_the_models(engine: Engine) -> None:
    # Alembic's autogenerate diff between the migrated schema and the ORM models must be empty
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_upgrade_is_idempotent_and_downgrade_reverts(engine: Engine) -> None:
    upgrade(engine)
    assert current_revision(engine) == head_revision()
    config = alembic_config(engine)
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "base")
    assert "inference_log" not in inspect(engine).get_table_names()


def test_cli_db_upgrade(db_url: str) -> None:
    result = CliRunner().invoke(cli, ["db", "upgrade", "--database-url", db_url])
    assert result.exit_code == 0, result.output
    engine = make_engine(db_url)
    try:
        assert current_revision(engine) == head_revision()
        assert "inference_log" in inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_ts_round_trips_as_aware_utc(engine: Engine) -> None:
    local = datetime(2024, 5, 1, 14, 30, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    with engine.begin() as conn:
        conn.execute(
            InferenceLog.__table__.insert(),
            [{"ts": local, "request_id": "r", "model": "m", "version": "v", "status": "stop"}],
        )
        ts = conn.execute(select(InferenceLog.ts)).scalar_one()
    assert ts.utcoffset() == timedelta(0)
    assert ts == local


def test_sqlite_uses_wal_and_busy_timeout(tmp_path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'a' / 'b' / 'x.db'}")
    try:
        with engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 5000
        assert (tmp_path / "a" / "b" / "x.db").exists()
    finally:
        engine.dispose()


def test_0002_adds_cached_tokens_and_keeps_older_rows(engine: Engine) -> None:
    """A row written at revision 0001 survives 0002 with cached_tokens NULL; downgrade drops it."""
    config = alembic_config(engine)
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0001")
    assert "cached_tokens" not in {c["name"] for c in inspect(engine).get_columns("inference_log")}
    old = {"ts": datetime.now(timezone.utc), "request_id": "old", "model": "m", "version": "v"}
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO inference_log (ts, request_id, model, version, status, prompt_tokens)"
                " VALUES (:ts, :request_id, :model, :version, 'stop', 7)"
            ),
            {**old, "ts": old["ts"].replace(tzinfo=None)},
        )
    upgrade(engine)
    with engine.begin() as conn:
        row = conn.execute(select(InferenceLog.prompt_tokens, InferenceLog.cached_tokens)).one()
        assert tuple(row) == (7, None)
        conn.execute(
            InferenceLog.__table__.insert(),
            [{**old, "request_id": "new", "status": "stop", "cached_tokens": 5}],
        )
        new = select(InferenceLog.cached_tokens).where(InferenceLog.request_id == "new")
        assert conn.execute(new).scalar_one() == 5


def test_0003_adds_choices_logprobs_constraint_and_keeps_older_rows(engine: Engine) -> None:
    """A row written at revision 0002 survives 0003 with n/logprobs/constraint NULL; a new row
    stores them; downgrade to 0002 drops the three columns."""
    config = alembic_config(engine)
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0002")
    columns = {c["name"] for c in inspect(engine).get_columns("inference_log")}
    assert not columns & {"n", "logprobs", "constraint"}
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
    cols = (InferenceLog.n, InferenceLog.logprobs, InferenceLog.constraint)
    with engine.begin() as conn:
        assert tuple(conn.execute(select(*cols)).one()) == (None, None, None)
        conn.execute(
            InferenceLog.__table__.insert(),
            [
                {
                    "ts": ts,
                    "request_id": "new",
                    "model": "m",
                    "version": "v",
                    "status": "stop",
                    "n": 4,
                    "logprobs": True,
                    "constraint": "json",
                }
            ],
        )
        new = select(*cols).where(InferenceLog.request_id == "new")
        assert tuple(conn.execute(new).one()) == (4, True, "json")


def test_0004_adds_tolerance_and_instance_and_keeps_older_rows(engine: Engine) -> None:
    """A row written at revision 0003 survives 0004 with tolerance/instance NULL; a new row
    stores them; downgrade to 0003 drops both columns and the instance index."""
    config = alembic_config(engine)
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0003")
    columns = {c["name"] for c in inspect(engine).get_columns("inference_log")}
    assert not columns & {"tolerance", "instance"}
    indexes = {i["name"] for i in inspect(engine).get_indexes("inference_log")}
    assert "ix_inference_log_instance" not in indexes
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
    indexes = {i["name"] for i in inspect(engine).get_indexes("inference_log")}
    assert "ix_inference_log_instance" in indexes
    cols = (InferenceLog.tolerance, InferenceLog.instance)
    with engine.begin() as conn:
        assert tuple(conn.execute(select(*cols)).one()) == (None, None)
        row = {"ts": ts, "model": "m", "version": "v", "status": "stop"}
        conn.execute(
            InferenceLog.__table__.insert(),
            [{**row, "request_id": "new", "tolerance": 0.55, "instance": "127.0.0.1:8000"}],
        )
        new = select(*cols).where(InferenceLog.request_id == "new")
        assert tuple(conn.execute(new).one()) == (0.55, "127.0.0.1:8000")


def test_a_migration_stopped_halfway_leaves_the_database_as_it_was(db_url: str) -> None:
    """All or nothing: the stamp failing after the tables were made (a server killed, a file
    locked by another process) must not leave tables behind without `alembic_version`, which
    made every later start fail on "table inference_log already exists"."""
    engine = make_engine(db_url)

    def stamp_fails(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO ALEMBIC_VERSION"):
            raise RuntimeError("stopped before the stamp")

    try:
        event.listen(engine, "before_cursor_execute", stamp_fails)
        with pytest.raises(RuntimeError, match="before the stamp"):
            upgrade(engine)
        event.remove(engine, "before_cursor_execute", stamp_fails)
        assert "inference_log" not in inspect(engine).get_table_names()
        assert current_revision(engine) is None
        upgrade(engine)  # the next start migrates from scratch
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()
