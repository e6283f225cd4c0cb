"""Finding 3 of issue 17: rows still queued when a shutdown's flush runs out (the database down)
are spilled to the spool and written at the next start, exactly once, on both databases; a
replay that runs twice (a crash after its commit) stores nothing twice."""

from __future__ import annotations

import fcntl
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, func, select

from storage.batch import REQUEST, Item
from storage.db import make_engine, upgrade
from storage.models import InferenceLog
from storage.rows import request_row
from storage.spool import Spool
from storage.writer import InferenceLogWriter
from tests.fixtures.pgcluster import PostgresCluster
from tests.storage.factories import probe, request_stats


def _rows(engine: Engine) -> list[tuple[str, str, str | None, float | None]]:
    with engine.connect() as conn:
        query = select(
            InferenceLog.request_id, InferenceLog.status, InferenceLog.op, InferenceLog.expected
        ).order_by(InferenceLog.request_id, InferenceLog.status, InferenceLog.op)
        return [tuple(r) for r in conn.execute(query)]  # type: ignore[misc]


def _record_traffic(writer: InferenceLogWriter, n: int) -> None:
    for i in range(n):
        verified = [probe(i, "logit", 1.0, 2.0), probe(i, "geglu", 0.5, 0.5)] if i % 5 == 0 else []
        writer.record(finished=[request_stats(i)], verified=verified)


def _expected_rows(n: int) -> list[tuple[str, str, str | None, float | None]]:
    out: list[tuple[str, str, str | None, float | None]] = []
    for i in range(n):
        out.append(
            (f"req-{i}", "stop", "logit" if i % 5 == 0 else None, 2.0 if i % 5 == 0 else None)
        )
        if i % 5 == 0:
            out.append((f"req-{i}", "probe", "geglu", 0.5))
    return sorted(out, key=lambda r: (r[0], r[1], r[2] or ""))


@contextmanager
def _sqlite_locked(path: Path) -> Iterator[None]:
    """Another connection holds the write lock: every write of the writer gets SQLITE_BUSY."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def _quick_busy_engine(url: str) -> Engine:
    engine = make_engine(url)

    @event.listens_for(engine, "connect")
    def _short_busy(dbapi_conn: Any, _record: Any) -> None:  # after make_engine's 5 s pragma
        dbapi_conn.execute("PRAGMA busy_timeout=50")

    return engine


def test_sqlite_locked_at_shutdown_then_replayed_once(tmp_path: Path) -> None:
    db, spool = tmp_path / "fastllm.db", tmp_path / "fastllm.db.spool.jsonl"
    url = f"sqlite:///{db}"
    upgrade(make_engine(url))
    engine = _quick_busy_engine(url)
    with _sqlite_locked(db):
        writer = InferenceLogWriter(engine, migrate=False, max_backoff_s=0.1, spool_path=spool)
        _record_traffic(writer, 40)
        assert writer.close(timeout=0.5) is False
    # 40 requests + 8 logit probes (merged) + 8 geglu probes, as queue items
    assert (writer.num_spilled, writer.num_dropped, writer.num_written) == (56, 0, 0)
    assert spool.is_file() and _rows(engine) == []

    for _ in range(2):  # the second start finds nothing left to replay
        again = InferenceLogWriter(engine, migrate=False, spool_path=spool)
        assert again.close(timeout=30)
        assert _rows(engine) == _expected_rows(40)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["fastllm.db", "fastllm.db.spool.jsonl.lock", *_sqlite_sidecars(tmp_path)]
    )


def _sqlite_sidecars(path: Path) -> list[str]:
    return [p.name for p in path.iterdir() if p.name.startswith("fastllm.db-")]


def test_postgres_down_at_shutdown_then_replayed_once(
    postgres_cluster: PostgresCluster, postgres_url: str, tmp_path: Path
) -> None:
    spool = tmp_path / "spool.jsonl"
    engine = make_engine(postgres_url)
    upgrade(engine)
    postgres_cluster.stop()
    try:
        writer = InferenceLogWriter(engine, migrate=False, max_backoff_s=0.1, spool_path=spool)
        _record_traffic(writer, 25)
        assert writer.close(timeout=1.0) is False
    finally:
        postgres_cluster.start()
    assert (writer.num_spilled, writer.num_dropped) == (35, 0)
    engine.dispose()
    again = InferenceLogWriter(make_engine(postgres_url), migrate=False, spool_path=spool)
    assert again.close(timeout=30)
    assert _rows(again.engine) == _expected_rows(25)
    again.engine.dispose()
    assert not spool.exists()


def test_a_replay_run_twice_stores_nothing_twice(engine: Engine, tmp_path: Path) -> None:
    """As after a crash between a replay's commit and the removal of its file."""
    spool = Spool(tmp_path / "spool.jsonl")
    first = InferenceLogWriter(engine, migrate=False)
    _record_traffic(first, 10)
    assert first.close(timeout=30)
    stored = _rows(engine)
    items = [Item(REQUEST, request_row(request_stats(i))) for i in range(12)]  # 10 stored + 2 new
    spool.append(items)
    spool.path.with_name("spool.jsonl.0123.claimed").write_text(spool.path.read_text())
    again = InferenceLogWriter(engine, migrate=False, spool_path=spool.path)
    assert again.close(timeout=30)
    new = [(f"req-{i}", "stop", None, None) for i in (10, 11)]
    assert _rows(engine) == sorted(stored + new, key=lambda r: (r[0], r[1], r[2] or ""))
    assert list(tmp_path.glob("spool.jsonl*")) == [tmp_path / "spool.jsonl.lock"]


def test_cut_lines_are_skipped_and_a_locked_claim_is_left_alone(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fastllm.db'}"
    engine = make_engine(url)
    upgrade(engine)
    spool = Spool(tmp_path / "spool.jsonl")
    spool.append([Item(REQUEST, request_row(request_stats(i))) for i in range(3)])
    with spool.path.open("a") as out:
        out.write('{"kind":"request","row":{"request_id":"req-cut"')  # a crash mid-line
    busy = spool.path.with_name("spool.jsonl.busy.claimed")
    Spool(busy).append([Item(REQUEST, request_row(request_stats(7)))])
    with busy.open() as held:  # a live process replaying it holds its lock
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        writer = InferenceLogWriter(engine, migrate=False, spool_path=spool.path)
        assert writer.close(timeout=30)
    assert [r[0] for r in _rows(engine)] == ["req-0", "req-1", "req-2"]
    assert busy.exists()
    writer = InferenceLogWriter(engine, migrate=False, spool_path=spool.path)
    assert writer.close(timeout=30)  # the lock is gone: an orphan, replayed now
    assert [r[0] for r in _rows(engine)] == ["req-0", "req-1", "req-2", "req-7"]
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(InferenceLog)).scalar() == 4
