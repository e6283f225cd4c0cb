"""Database outage: PostgreSQL stops while the writer has rows queued. record() keeps returning
(the engine thread is never held), the drain thread retries, and after the restart every row is
stored, or counted as dropped when the queue overflowed; nothing else is lost or duplicated."""

from __future__ import annotations

import threading
import time

from sqlalchemy import select

from storage.db import make_engine, upgrade
from storage.models import InferenceLog
from storage.writer import InferenceLogWriter
from tests.fixtures.pgcluster import PostgresCluster
from tests.storage.factories import probe, request_stats


def wait_for_retries(writer: InferenceLogWriter, at_least: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while writer.num_retries < at_least:
        assert time.monotonic() < deadline, "the writer never retried against the stopped server"
        time.sleep(0.05)


def stored_ids(url: str) -> list[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(InferenceLog.request_id)).scalars())
    finally:
        engine.dispose()


def test_rows_queued_during_outage_are_written_after_restart(
    postgres_cluster: PostgresCluster, postgres_url: str
) -> None:
    engine = make_engine(postgres_url)
    upgrade(engine)
    writer = InferenceLogWriter(engine, batch_size=8, max_backoff_s=0.2, migrate=False)
    writer.record(finished=[request_stats(i) for i in range(10)])
    assert writer.flush(30)

    postgres_cluster.stop()
    for i in range(10, 60):  # the engine keeps finishing requests while the database is down
        writer.record(finished=[request_stats(i)], verified=[probe(i, "geglu", 1.0, 1.0)])
    wait_for_retries(writer, 3)
    assert writer.num_dropped == 0
    postgres_cluster.start()

    assert writer.flush(60)
    assert writer.close(timeout=30)
    ids = stored_ids(postgres_url)
    request_ids = [f"req-{i}" for i in range(60)]
    assert sorted(ids) == sorted(request_ids + [f"req-{i}" for i in range(10, 60)])
    engine.dispose()


def test_overflow_during_outage_is_counted_and_the_rest_is_written(
    postgres_cluster: PostgresCluster, postgres_url: str
) -> None:
    engine = make_engine(postgres_url)
    upgrade(engine)
    dropped: list[int] = []
    writer = InferenceLogWriter(
        engine,
        queue_size=20,
        batch_size=5,
        max_backoff_s=0.2,
        migrate=False,
        on_drop=lambda n, reason: dropped.append(n),
    )
    postgres_cluster.stop()
    writer.record(finished=[request_stats(0)])
    wait_for_retries(writer, 1)  # the drain thread holds a batch it cannot write
    for i in range(1, 100):
        writer.record(finished=[request_stats(i)])
    assert writer.num_dropped > 0
    postgres_cluster.start()
    writer.close(timeout=60)

    ids = stored_ids(postgres_url)
    assert len(ids) == len(set(ids))  # nothing written twice
    assert set(ids) <= {f"req-{i}" for i in range(100)}
    assert len(ids) + writer.num_dropped == 100  # every request is either stored or counted
    assert sum(dropped) == writer.num_dropped
    engine.dispose()


def test_close_gives_up_at_its_deadline_and_counts_the_rest(
    postgres_cluster: PostgresCluster, postgres_url: str
) -> None:
    engine = make_engine(postgres_url)
    upgrade(engine)
    writer = InferenceLogWriter(engine, batch_size=4, max_backoff_s=0.2, migrate=False)
    postgres_cluster.stop()
    writer.record(finished=[request_stats(i) for i in range(10)])
    assert writer.close(timeout=1.0) is False
    assert writer.num_dropped == 10 and writer.num_written == 0
    engine.dispose()


def test_database_back_during_close_gets_every_row(
    postgres_cluster: PostgresCluster, postgres_url: str
) -> None:
    """A long outage (many more retries than a few attempts) that ends while close() waits: close
    keeps retrying until its deadline, so the server coming back inside it means nothing is lost."""
    engine = make_engine(postgres_url)
    upgrade(engine)
    writer = InferenceLogWriter(engine, batch_size=4, max_backoff_s=0.2, migrate=False)
    postgres_cluster.stop()
    writer.record(finished=[request_stats(i) for i in range(10)])
    wait_for_retries(writer, 12)  # well past any small attempt cap, and nothing given up
    assert writer.num_dropped == 0 and writer.num_written == 0

    closing = threading.Event()

    def restart_once_close_is_retrying() -> None:
        # a few more failed attempts after close() began prove the drain thread kept retrying
        # inside close before the server came back (a writer that gave up stops retrying: then
        # the server comes back after 10 s anyway, and close has already returned False)
        closing.wait(30)
        target, deadline = writer.num_retries + 3, time.monotonic() + 10
        while writer.num_retries < target and time.monotonic() < deadline:
            time.sleep(0.05)
        postgres_cluster.start()

    restarter = threading.Thread(target=restart_once_close_is_retrying)
    restarter.start()
    try:
        closing.set()
        assert writer.close(timeout=60) is True
    finally:
        closing.set()
        restarter.join(60)
    assert writer.num_dropped == 0 and writer.num_written == 10
    assert sorted(stored_ids(postgres_url)) == sorted(f"req-{i}" for i in range(10))
    engine.dispose()
