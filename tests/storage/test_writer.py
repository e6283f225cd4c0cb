from __future__ import annotations

import random

from sqlalchemy import Engine, func, select

from runtime.engine.stats import RequestStats
from storage.models import InferenceLog
from storage.writer import InferenceLogWriter
from tests.storage.factories import PER_OP_PROBES, probe, request_stats

REASONS = ("stop", "length", "cancelled", "validation", "overloaded", "internal", "timeout")


def rows(engine: Engine) -> list[InferenceLog]:
    from sqlalchemy.orm import Session

    with Session(engine) as session:
        return list(session.scalars(select(InferenceLog).order_by(InferenceLog.id)))


def test_one_row_per_request_plus_probe_rows(engine: Engine) -> None:
    rng = random.Random(7)
    n, verified = 120, set(rng.sample(range(120), 15))
    writer = InferenceLogWriter(engine, batch_size=16, migrate=False)
    for i in range(n):
        stats = request_stats(i, reason=REASONS[i % len(REASONS)])
        probes = []
        if i in verified:
            probes = [probe(i, "logit", 1.5, 1.5)] + [
                probe(i, op, 0.25, 0.25) for op in PER_OP_PROBES
            ]
        writer.record(finished=[stats], verified=probes)
    assert writer.close(timeout=30)
    stored = rows(engine)
    requests = [r for r in stored if r.status != "probe"]
    probe_rows = [r for r in stored if r.status == "probe"]
    assert sorted(r.request_id for r in requests) == sorted(f"req-{i}" for i in range(n))
    assert {r.status for r in requests} == set(REASONS)
    assert {r.request_id for r in requests if r.op == "logit"} == {f"req-{i}" for i in verified}
    assert all(r.output == r.expected == 1.5 for r in requests if r.op == "logit")
    assert all(r.op is None and r.output is None for r in requests if r.op != "logit")
    assert len(probe_rows) == len(verified) * len(PER_OP_PROBES)
    assert {r.op for r in probe_rows} == set(PER_OP_PROBES)
    assert writer.num_written == len(stored) and writer.num_dropped == 0


def test_request_row_fields(engine: Engine) -> None:
    stats = request_stats(3, reason="length")
    with InferenceLogWriter(engine, migrate=False) as writer:
        writer.record(finished=[stats])
    (row,) = rows(engine)
    assert (row.request_id, row.model, row.version, row.status) == (
        "req-3",
        "tiny",
        "stable",
        "length",
    )
    assert (row.prompt_tokens, row.completion_tokens, row.batch_size) == (6, 4, 4)
    assert row.cached_tokens == 0 == stats.cached_tokens
    cached = request_stats(5)  # cached_tokens = 5 % 3
    with InferenceLogWriter(engine, migrate=False) as writer:
        writer.record(finished=[cached])
    assert {r.request_id: r.cached_tokens for r in rows(engine)}["req-5"] == 2
    assert abs(row.latency_s - stats.e2e_seconds) < 1e-9
    assert abs(row.ttft_s - stats.ttft_seconds) < 1e-9
    assert abs(row.ts.timestamp() - stats.finished_ts) < 1e-5


def test_logit_probe_lands_on_the_request_row_in_any_order(engine: Engine) -> None:
    writer = InferenceLogWriter(engine, migrate=False)
    writer.record(finished=[request_stats(0)], verified=[probe(0, "logit", 1.0, 2.0)])  # together
    writer.record(finished=[request_stats(1)])
    assert writer.flush(30)  # req-1's row is stored before its verification arrives
    writer.record(verified=[probe(1, "logit", 3.0, 4.0)])
    writer.record(verified=[probe(2, "logit", 5.0, 6.0)])  # verification before the request row
    assert writer.flush(30)
    writer.record(finished=[request_stats(2)])
    writer.record(verified=[probe(9, "logit", 7.0, 8.0)])  # its request row never comes
    assert writer.close(timeout=30)
    by_id = {}
    for r in rows(engine):
        by_id.setdefault(r.request_id, []).append((r.status, r.op, r.output, r.expected))
    assert by_id["req-0"] == [("stop", "logit", 1.0, 2.0)]
    assert by_id["req-1"] == [("stop", "logit", 3.0, 4.0)]
    # flushed before its request row: kept as a probe row, the request row stays plain
    assert sorted(by_id["req-2"], key=str) == sorted(
        [("probe", "logit", 5.0, 6.0), ("stop", None, None, None)], key=str
    )
    assert by_id["req-9"] == [("probe", "logit", 7.0, 8.0)]


def test_early_logit_merges_when_the_request_row_follows_before_a_flush(engine: Engine) -> None:
    writer = InferenceLogWriter(engine, migrate=False, autostart=False)
    writer.record(verified=[probe(4, "logit", 1.0, 1.25)])
    writer.record(finished=[request_stats(4)])
    writer.start()
    assert writer.close(timeout=30)
    assert [(r.status, r.op, r.expected) for r in rows(engine)] == [("stop", "logit", 1.25)]


def test_full_queue_drops_and_counts(engine: Engine) -> None:
    dropped: list[tuple[int, str]] = []
    writer = InferenceLogWriter(
        engine,
        queue_size=5,
        migrate=False,
        autostart=False,
        on_drop=lambda n, reason: dropped.append((n, reason)),
    )
    for i in range(8):
        writer.record(finished=[request_stats(i)])
    assert writer.num_dropped == 3 and dropped == [(1, "queue_full")] * 3
    writer.start()
    assert writer.close(timeout=30) is False  # something was dropped
    assert [r.request_id for r in rows(engine)] == [f"req-{i}" for i in range(5)]


def test_record_never_raises(engine: Engine) -> None:
    dropped: list[int] = []

    def broken_hook(n: int, reason: str) -> None:
        dropped.append(n)
        raise RuntimeError("metrics hook is broken")

    writer = InferenceLogWriter(engine, migrate=False, on_drop=broken_hook)
    bad = RequestStats(request_id="bad", model="m", finished_ts="not a time")  # type: ignore[arg-type]
    writer.record(finished=[bad])
    writer.record(finished=[request_stats(1)])
    writer.close(timeout=30)
    writer.record(finished=[request_stats(2)])  # after close: counted, not raised
    assert dropped == [1, 1]
    assert [r.request_id for r in rows(engine)] == ["req-1"]


def test_close_without_start_counts_queued_rows_as_dropped(engine: Engine) -> None:
    writer = InferenceLogWriter(engine, migrate=False, autostart=False)
    writer.record(finished=[request_stats(i) for i in range(4)])
    assert writer.close(timeout=1) is False
    assert writer.num_dropped == 4
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(InferenceLog)).scalar() == 0


def test_writer_migrates_a_fresh_database(db_url: str) -> None:
    writer = InferenceLogWriter(db_url)  # migrate=True: the drain thread applies migrations first
    writer.record(finished=[request_stats(i) for i in range(10)])
    assert writer.close(timeout=30)
    assert len(rows(writer.engine)) == 10
    writer.engine.dispose()


def test_only_connection_problems_are_retried() -> None:
    from sqlalchemy.exc import IntegrityError, OperationalError

    from storage.drain import is_transient
    from storage.errors import StorageError

    refused = OperationalError("INSERT", {}, Exception("connection refused"))
    assert is_transient(refused)
    wrapped = StorageError("cannot migrate")
    wrapped.__cause__ = refused
    assert is_transient(wrapped)  # migrations at start retry too
    assert not is_transient(IntegrityError("INSERT", {}, Exception("duplicate key")))
    assert not is_transient(ValueError("bad row"))
