"""Issue 21: the writer's edges that mutation testing found untested: flush() deadlines and its
waiter count, the retry counter and its log lines, spilling and dropping at close (per batch, by
reason), replayed spool rows in the counters, and from_settings. On SQLite files in tmp_path; a
database "down" is a SQLite file whose write lock another connection holds."""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, select

from runtime.config import load_settings
from storage.batch import REQUEST, Item
from storage.db import make_engine, upgrade
from storage.models import InferenceLog
from storage.rows import request_row
from storage.spool import Spool
from storage.writer import InferenceLogWriter
from tests.fixtures.garbage import collecting_what_the_test_leaves
from tests.storage.factories import probe, request_stats
from tests.storage.test_spool import _sqlite_locked

WAIT_S = 10.0  # bound on every wait below; reaching it is a failure, never a speed measurement


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """A leaked connection warns (an error) in the test that leaked it (what the test created
    is collected, not the whole heap: tests.fixtures.garbage)."""
    with collecting_what_the_test_leaves():
        yield


def _wait_until(cond: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _db(tmp_path: Path) -> tuple[Path, str]:
    """A migrated SQLite file and its URL."""
    path = tmp_path / "fastllm.db"
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    return path, url


def _busy_engine(url: str, busy_ms: int = 1) -> Engine:
    """An engine whose writes give up on a locked file after `busy_ms` (instead of 5 s)."""
    engine = make_engine(url)

    @event.listens_for(engine, "connect")
    def _short_busy(dbapi_conn: Any, _record: Any) -> None:  # after make_engine's 5 s pragma
        dbapi_conn.execute(f"PRAGMA busy_timeout={busy_ms}")

    return engine


def _recording_drops(url: str, **kwargs: Any) -> tuple[InferenceLogWriter, list[tuple[int, str]]]:
    """A writer whose on_drop hook records (n, reason) in the list returned with it."""
    drops: list[tuple[int, str]] = []
    writer = InferenceLogWriter(url, on_drop=lambda n, reason: drops.append((n, reason)), **kwargs)
    return writer, drops


def _stored(engine: Engine) -> list[tuple[str, str, str | None]]:
    with engine.connect() as conn:
        query = select(InferenceLog.request_id, InferenceLog.status, InferenceLog.op)
        return sorted((r[0], r[1], r[2]) for r in conn.execute(query))


class _Lock:
    """Holds the write lock of a SQLite file until `release()` (from any thread)."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute("BEGIN EXCLUSIVE")
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._conn.execute("ROLLBACK")
            self._conn.close()


class _InThread:
    """Runs `fn` in a thread; `.join()` fails the test when it has not returned in time."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = self.ended = 0.0

        def body() -> None:
            self.started = time.monotonic()
            try:
                self.result = fn()
            except BaseException as exc:  # re-raised in join()
                self.error = exc
            finally:
                self.ended = time.monotonic()

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()

    def join(self, timeout_s: float = WAIT_S) -> Any:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"did not return within {timeout_s} s"
        if self.error is not None:
            raise self.error
        return self.result

    @property
    def elapsed(self) -> float:
        return self.ended - self.started


# --- flush ----------------------------------------------------------------------------------------
def test_flush_with_a_timeout_returns_false_at_its_deadline_while_the_database_is_locked(
    tmp_path: Path,
) -> None:
    path, url = _db(tmp_path)
    engine = _busy_engine(url)
    try:
        with _sqlite_locked(path):
            writer = InferenceLogWriter(engine, migrate=False, max_backoff_s=0.05)
            writer.record(finished=[request_stats(0)])
            _wait_until(lambda: writer.num_retries >= 1, "a failed attempt")
            flusher = _InThread(lambda: writer.flush(timeout=0.3))
            assert flusher.join() is False  # returns, while the database is still locked
            assert flusher.elapsed >= 0.3  # not before its deadline
            assert writer.num_flush_waiters == 0
        assert writer.close(timeout=WAIT_S)  # the lock is gone: the row is written
        assert _stored(engine) == [("req-0", "stop", None)]
    finally:
        engine.dispose()


def test_flush_of_a_writer_never_started_returns_false_at_once(tmp_path: Path) -> None:
    _, url = _db(tmp_path)
    writer = InferenceLogWriter(url, migrate=False, autostart=False)
    try:
        assert _InThread(writer.flush).join() is True  # nothing accepted: nothing to wait for
        writer.record(finished=[request_stats(0)])
        assert _InThread(writer.flush).join() is False  # no timeout, but nothing drains the queue
        assert writer.num_flush_waiters == 0
        assert writer.close(timeout=1) is False
        assert writer.num_dropped_by_reason == {"shutdown": 1}
    finally:
        writer.engine.dispose()


def test_flush_without_timeout_waits_for_the_database_and_counts_its_waiters(
    tmp_path: Path,
) -> None:
    """Two flush() calls wait while the database is locked (num_flush_waiters: 2, which makes the
    drain thread write early logit probes at once); both return True once the rows are written."""
    path, url = _db(tmp_path)
    engine = _busy_engine(url)
    try:
        with _sqlite_locked(path):
            writer = InferenceLogWriter(engine, migrate=False, max_backoff_s=0.05)
            writer.record(finished=[request_stats(0)], verified=[probe(9, "logit", 1.0, 2.0)])
            _wait_until(lambda: writer.num_retries >= 1, "a failed attempt")
            assert writer.num_flush_waiters == 0
            flushers = [_InThread(writer.flush), _InThread(writer.flush)]
            _wait_until(lambda: writer.num_flush_waiters == 2, "two flush waiters")
            assert all(f.thread.is_alive() for f in flushers)
        assert [f.join() for f in flushers] == [True, True]
        assert writer.num_flush_waiters == 0
        # req-9's logit probe has no request row: a waiting flush wrote it as a probe row
        assert _stored(engine) == [("req-0", "stop", None), ("req-9", "probe", "logit")]
        assert writer.close(timeout=WAIT_S)
    finally:
        engine.dispose()


def test_an_early_logit_probe_waits_for_its_request_row_after_a_flush(tmp_path: Path) -> None:
    """Once no flush() waits any more, an early logit probe is kept (up to orphan_timeout_s) for
    its request row instead of being written as a probe row of its own."""
    _, url = _db(tmp_path)
    writer = InferenceLogWriter(url, migrate=False)
    try:
        writer.record(finished=[request_stats(0)])
        assert writer.flush(WAIT_S)
        assert writer.num_flush_waiters == 0
        writer.record(verified=[probe(1, "logit", 1.0, 2.0)])
        _wait_until(lambda: writer.num_queued == 0, "the probe taken")
        time.sleep(0.3)  # several idle rounds of the drain thread (POLL_S = 0.05)
        assert writer.num_settled == writer.num_accepted - 1  # the probe is still held
        writer.record(finished=[request_stats(1)])
        assert writer.flush(WAIT_S)
        assert _stored(writer.engine) == [("req-0", "stop", None), ("req-1", "stop", "logit")]
        # one waiting flush() is enough to have an early probe written as a probe row
        writer.record(verified=[probe(2, "logit", 3.0, 4.0)])
        assert writer.flush(WAIT_S)
        assert ("req-2", "probe", "logit") in _stored(writer.engine)
        assert writer.close(timeout=WAIT_S)
    finally:
        writer.engine.dispose()


# --- retries --------------------------------------------------------------------------------------
def test_every_failed_attempt_is_one_retry_and_every_twentieth_is_logged(tmp_path: Path) -> None:
    path, url = _db(tmp_path)
    engine = _busy_engine(url)
    seen: list[int] = []  # num_retries at each "database unavailable" warning
    messages: list[str] = []

    class Spy(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "database unavailable" in record.getMessage():
                seen.append(writer.num_retries)
                messages.append(record.getMessage())

    drain_log = logging.getLogger("storage.drain")
    spy = Spy(logging.WARNING)
    drain_log.addHandler(spy)
    attempts: list[int] = []

    @event.listens_for(engine, "handle_error")
    def _failed(_ctx: Any) -> None:
        attempts.append(1)

    try:
        with _sqlite_locked(path):
            writer = InferenceLogWriter(engine, migrate=False, max_backoff_s=0.01)
            writer.record(finished=[request_stats(0)])
            _wait_until(lambda: writer.num_retries >= 21, "21 retries")
        assert writer.close(timeout=WAIT_S)
    finally:
        drain_log.removeHandler(spy)
        engine.dispose()
    final = writer.num_retries
    assert final == len(attempts)  # each failed attempt was retried once; the last one worked
    assert seen == [n for n in range(1, final + 1) if n == 1 or n % 20 == 0]
    assert "locked" in messages[0] and messages[0].endswith("; retrying")
    assert _stored(engine) == [("req-0", "stop", None)] and writer.num_written == 1


def test_retries_back_off_exponentially_up_to_max_backoff_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait before retry k is 0.05 * 2**(k-1) s, at most max_backoff_s, plus up to 0.05 s of
    jitter (the seconds asked of the drain thread's sleep; how long it really slept is not
    measured)."""
    from storage.drain import Drainer

    asked: list[float] = []
    sleep = Drainer._sleep

    def recording_sleep(self: Drainer, seconds: float) -> None:
        asked.append(seconds)
        sleep(self, seconds)

    monkeypatch.setattr(Drainer, "_sleep", recording_sleep)
    path, url = _db(tmp_path)
    engine = _busy_engine(url)
    try:
        with _sqlite_locked(path):
            writer = InferenceLogWriter(engine, migrate=False, max_backoff_s=0.3)
            writer.record(finished=[request_stats(0)])
            _wait_until(lambda: writer.num_retries >= 7, "7 retries")
        assert writer.close(timeout=WAIT_S)
    finally:
        engine.dispose()
    assert len(asked) == writer.num_retries  # one wait before each retry
    base = [0.05, 0.1, 0.2, 0.3, 0.3, 0.3, 0.3]
    for k, (seconds, low) in enumerate(zip(asked, base, strict=False)):
        assert low <= seconds <= low + 0.05, (k, asked)
    assert len({round(s - low, 6) for s, low in zip(asked, base, strict=False)}) > 1  # jitter


def test_every_unstorable_batch_counts_as_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, url = _db(tmp_path)
    writer = InferenceLogWriter(url, migrate=False, autostart=False, batch_size=3)
    try:
        for i in range(6):
            bad = dataclasses.replace(request_stats(i), model="\ud800") if i % 3 == 1 else None
            writer.record(finished=[bad or request_stats(i)])
        with caplog.at_level(logging.WARNING, logger="storage.drain"):
            writer.start()
            assert writer.close(timeout=WAIT_S) is False
        refused = [r.getMessage() for r in caplog.records if "row by row" in r.getMessage()]
        assert len(refused) == 2
        assert all("(UnicodeEncodeError: " in m for m in refused)  # the database's refusal
        assert writer._drainer.num_failed_batches == 2
        assert writer.num_dropped_by_reason == {"unstorable": 2} and writer.num_written == 4
    finally:
        writer.engine.dispose()


def test_malformed_spooled_rows_are_dropped_and_the_drain_thread_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A spool line that decodes but is not a whole row (another version, an edited file) makes
    its batch unplannable: the batch is dropped ("unstorable"), later rows are still written."""
    _, url = _db(tmp_path)
    spool = tmp_path / "spool.jsonl"
    good = request_row(request_stats(1))
    ts = good["ts"].isoformat()
    lines = [
        {"kind": "request", "row": {**good, "ts": ts}},
        {"kind": "logit", "row": {"ts": ts, "request_id": "req-1", "op": "logit"}},  # no values
    ]
    spool.write_text("".join(json.dumps(line) + "\n" for line in lines))
    writer, drops = _recording_drops(url, migrate=False, spool_path=spool)
    try:
        with caplog.at_level(logging.ERROR, logger="storage.drain"):
            _wait_until(lambda: writer.num_replayed == 2, "the spool replayed")
            writer.record(finished=[request_stats(2)])
            assert writer.flush(WAIT_S)
        assert drops == [(2, "unstorable")]
        assert writer.num_replayed == 2 and writer.num_settled == writer.num_accepted == 3
        assert any("dropping 2 malformed rows" in r.getMessage() for r in caplog.records)
        assert _stored(writer.engine) == [("req-2", "stop", None)]
        assert writer.close(timeout=WAIT_S) is False
    finally:
        writer.engine.dispose()


# --- close: spill and drop ------------------------------------------------------------------------
def test_close_without_a_spool_drops_every_batch_as_shutdown(tmp_path: Path) -> None:
    _, url = _db(tmp_path)
    writer, drops = _recording_drops(url, migrate=False, autostart=False, batch_size=4)
    try:
        writer.record(finished=[request_stats(i) for i in range(10)])
        assert writer.close(timeout=1) is False
        assert drops == [(4, "shutdown"), (4, "shutdown"), (2, "shutdown")]
        assert writer.num_dropped == 10 and writer.num_dropped_by_reason == {"shutdown": 10}
        assert (writer.num_spilled, writer.num_settled, writer.num_accepted) == (0, 10, 10)
    finally:
        writer.engine.dispose()


def test_queue_full_drops_add_up_by_reason(tmp_path: Path) -> None:
    """Every item of one record() call that finds the queue full is counted, and the counts of
    separate calls add up."""
    _, url = _db(tmp_path)
    writer, drops = _recording_drops(url, migrate=False, autostart=False, queue_size=2)
    try:
        writer.record(finished=[request_stats(0)])
        writer.record(finished=[request_stats(i) for i in (1, 2, 3)])  # room for one of three
        writer.record(finished=[request_stats(4)], verified=[probe(4, "geglu", 1.0, 1.0)])
        assert drops == [(2, "queue_full"), (2, "queue_full")]
        assert writer.num_dropped_by_reason == {"queue_full": 4} and writer.num_dropped == 4
        assert writer.num_accepted == 2
        writer.start()
        assert writer.close(timeout=WAIT_S) is False
        assert writer.close(timeout=WAIT_S) is False  # a second close gives the same answer
        assert writer.num_dropped_by_reason == {"queue_full": 4}
        assert [r[0] for r in _stored(writer.engine)] == ["req-0", "req-1"]
    finally:
        writer.engine.dispose()


def test_record_after_close_drops_every_item_as_shutdown(tmp_path: Path) -> None:
    _, url = _db(tmp_path)
    writer, drops = _recording_drops(url, migrate=False)
    try:
        writer.record(finished=[request_stats(0)])
        assert writer.close(timeout=WAIT_S) is True
        assert writer.close(timeout=WAIT_S) is True  # a second close gives the same answer
        writer.record(
            finished=[request_stats(i) for i in (1, 2, 3)], verified=[probe(1, "logit", 1, 1)]
        )
        assert drops == [(4, "shutdown")]
        assert writer.num_dropped_by_reason == {"shutdown": 4} and writer.num_accepted == 1
        assert _stored(writer.engine) == [("req-0", "stop", None)]
    finally:
        writer.engine.dispose()


def test_a_malformed_stat_drops_everything_of_its_call_as_unstorable(tmp_path: Path) -> None:
    _, url = _db(tmp_path)
    writer, drops = _recording_drops(url, migrate=False)
    try:
        bad = dataclasses.replace(request_stats(0), finished_ts="not a time")  # type: ignore[arg-type]
        verified = [probe(0, "logit", 1.0, 1.0), probe(0, "geglu", 1.0, 1.0)]
        with pytest.raises(TypeError):  # what record() has to survive
            request_row(bad)
        writer.record(finished=[bad], verified=verified)  # does not raise
        assert drops == [(3, "unstorable")]
        assert writer.num_dropped_by_reason == {"unstorable": 3} and writer.num_accepted == 0
        writer.record(finished=[request_stats(1)])
        assert writer.close(timeout=WAIT_S) is False
        assert _stored(writer.engine) == [("req-1", "stop", None)]
    finally:
        writer.engine.dispose()


def test_spilled_batches_add_up_and_replayed_rows_count_as_accepted(tmp_path: Path) -> None:
    """A never-started writer spills its queue batch by batch at close; the next writer replays
    the spool and an orphaned claimed file (num_replayed adds both up), and flush()/close() wait
    for the replayed rows as for recorded ones (num_accepted counts them)."""
    _, url = _db(tmp_path)
    spool_path = tmp_path / "spool.jsonl"
    first = InferenceLogWriter(
        url, migrate=False, autostart=False, batch_size=4, spool_path=spool_path
    )
    try:
        first.record(finished=[request_stats(i) for i in range(10)])
        assert first.close(timeout=1) is False
        assert (first.num_spilled, first.num_dropped, first.num_settled) == (10, 0, 10)
        assert len(spool_path.read_text().splitlines()) == 10
    finally:
        first.engine.dispose()
    # a claimed file whose replayer died: taken up again
    orphaned = [Item(REQUEST, request_row(request_stats(i))) for i in range(10, 13)]
    Spool(tmp_path / "other.jsonl").append(orphaned)
    (tmp_path / "other.jsonl").rename(tmp_path / "spool.jsonl.0123.claimed")

    again = InferenceLogWriter(
        url, migrate=False, autostart=False, batch_size=4, spool_path=spool_path
    )
    try:
        again.record(finished=[request_stats(i) for i in range(20, 25)])
        again.start()
        assert again.flush(WAIT_S)
        assert again.close(timeout=WAIT_S)
        assert again.num_replayed == 13
        assert again.num_accepted == again.num_settled == 18
        assert again.num_written == 18 and again.num_spilled == again.num_dropped == 0
        ids = [r[0] for r in _stored(again.engine)]
        assert sorted(ids) == sorted(f"req-{i}" for i in [*range(13), *range(20, 25)])
    finally:
        again.engine.dispose()
    assert list(tmp_path.glob("spool.jsonl*")) == [tmp_path / "spool.jsonl.lock"]


# --- from_settings --------------------------------------------------------------------------------
def test_from_settings_maps_every_setting(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    settings = load_settings(
        database_url=f"sqlite:///{db}", log_queue_size=2, log_batch_size=3, log_spool_path=None
    )
    drops: list[tuple[int, str]] = []
    writer = InferenceLogWriter.from_settings(
        settings,
        on_drop=lambda n, reason: drops.append((n, reason)),
        autostart=False,  # kwargs reach the constructor: no thread, no migration
        migrate=False,
    )
    try:
        assert writer.engine.url.database == str(db)
        assert writer.batch_size == 3
        assert writer.spool is not None and writer.spool.path == tmp_path / "app.db.spool.jsonl"
        writer.record(finished=[request_stats(i) for i in range(4)])  # queue of 2: two dropped
        assert drops == [(2, "queue_full")]
        assert writer.num_queued == 2
        assert writer.flush() is False  # autostart=False was passed on: nothing drains
        assert writer.close(timeout=1) is False
        assert writer.num_spilled == 2  # into the default spool beside the SQLite file
        assert len((tmp_path / "app.db.spool.jsonl").read_text().splitlines()) == 2
    finally:
        writer.engine.dispose()

    explicit = tmp_path / "elsewhere" / "log.jsonl"
    settings = load_settings(database_url=f"sqlite:///{db}", log_spool_path=explicit)
    writer = InferenceLogWriter.from_settings(settings, autostart=False, migrate=False)
    try:
        assert writer.spool is not None and writer.spool.path == explicit
        assert writer.batch_size == 256
    finally:
        writer.close(timeout=1)
        writer.engine.dispose()


# --- the drain thread -----------------------------------------------------------------------------
def test_the_drain_thread_is_a_daemon_named_inference_log_and_ends_at_close(
    tmp_path: Path,
) -> None:
    _, url = _db(tmp_path)
    before = set(threading.enumerate())
    writer = InferenceLogWriter(url, migrate=False)
    try:
        (thread,) = set(threading.enumerate()) - before
        assert (thread.name, thread.daemon) == ("inference-log", True)
        writer.record(finished=[request_stats(0)])
        assert writer.close(timeout=1)
        assert not thread.is_alive()  # close() returned because the thread ended
    finally:
        writer.close(timeout=1)  # a second close is harmless; ends the thread when a check failed
        writer.engine.dispose()


def test_defaults_queue_10000_rows_in_batches_of_256(tmp_path: Path) -> None:
    _, url = _db(tmp_path)
    writer = InferenceLogWriter(url, migrate=False, autostart=False)
    try:
        assert writer.batch_size == 256
        stats = request_stats(0)
        writer.record(finished=[stats] * 10001)
        assert (writer.num_queued, writer.num_dropped) == (10000, 1)
        assert len(writer.take(0)) == 256
    finally:
        writer.close(timeout=0)
        writer.engine.dispose()


def test_an_early_logit_probe_is_written_alone_once_it_is_older_than_orphan_timeout_s(
    tmp_path: Path,
) -> None:
    """No flush, no close: other batches are written meanwhile, and the probe still ages out."""
    _, url = _db(tmp_path)
    writer = InferenceLogWriter(url, migrate=False, orphan_timeout_s=0.3)
    try:
        born = time.monotonic()
        writer.record(verified=[probe(1, "logit", 1.0, 2.0)])
        _wait_until(lambda: writer.num_queued == 0, "the probe taken")
        writer.record(finished=[request_stats(0)])  # a batch written while the probe waits
        _wait_until(lambda: writer.num_written >= 1, "the other batch written")
        _wait_until(lambda: writer.num_settled == writer.num_accepted, "the probe written")
        assert time.monotonic() - born >= 0.3  # not before it was orphan_timeout_s old
        assert _stored(writer.engine) == [("req-0", "stop", None), ("req-1", "probe", "logit")]
        assert writer.close(timeout=WAIT_S)
    finally:
        writer.engine.dispose()


def test_a_second_early_logit_probe_of_one_request_becomes_a_probe_row(tmp_path: Path) -> None:
    _, url = _db(tmp_path)
    writer = InferenceLogWriter(url, migrate=False)
    try:
        writer.record(verified=[probe(5, "logit", 1.0, 1.5)])
        _wait_until(lambda: writer.num_queued == 0, "the first probe taken")
        writer.record(verified=[probe(5, "logit", 2.0, 2.5)])
        _wait_until(lambda: writer.num_written == 1, "the second probe written")
        assert writer.num_settled == writer.num_accepted - 1  # the first one is still held
        writer.record(finished=[request_stats(5)])
        assert writer.close(timeout=WAIT_S)
        with writer.engine.connect() as conn:
            query = select(InferenceLog.status, InferenceLog.op, InferenceLog.expected)
            assert sorted(tuple(r) for r in conn.execute(query)) == [
                ("probe", "logit", 2.5),
                ("stop", "logit", 1.5),
            ]
    finally:
        writer.engine.dispose()


def test_only_connection_problems_are_transient() -> None:
    from sqlalchemy.exc import DBAPIError, IntegrityError

    from storage.drain import is_transient

    lost = DBAPIError("INSERT", {}, Exception("server closed"), connection_invalidated=True)
    assert is_transient(lost)
    assert not is_transient(DBAPIError("INSERT", {}, Exception("syntax")))
    refused = IntegrityError("INSERT", {}, Exception("duplicate key"))
    refused.__cause__ = lost
    assert is_transient(refused)  # the cause decides


# --- close ----------------------------------------------------------------------------------------
def test_close_keeps_retrying_until_its_deadline(tmp_path: Path) -> None:
    """The database comes back while close() waits: every batch is written, nothing spilled."""
    path, url = _db(tmp_path)
    engine = _busy_engine(url)
    lock = _Lock(path)
    try:
        writer = InferenceLogWriter(
            engine, migrate=False, batch_size=4, max_backoff_s=0.05, spool_path=tmp_path / "s"
        )
        writer.record(finished=[request_stats(i) for i in range(10)])
        _wait_until(lambda: writer.num_retries >= 1, "a failed attempt")
        closing = threading.Event()

        def release_once_close_retried() -> None:
            closing.wait(WAIT_S)
            target = writer.num_retries + 3
            _wait_until(lambda: writer.num_retries >= target, "retries inside close()")
            lock.release()

        releaser = _InThread(release_once_close_retried)
        closing.set()
        assert writer.close(timeout=WAIT_S) is True
        releaser.join()
        assert (writer.num_written, writer.num_spilled, writer.num_dropped) == (10, 0, 0)
        assert writer.close(timeout=WAIT_S) is True  # a second close gives the same answer
        assert len(_stored(engine)) == 10
    finally:
        lock.release()
        engine.dispose()


def test_at_the_deadline_the_held_batch_and_the_queue_are_spilled(tmp_path: Path) -> None:
    path, url = _db(tmp_path)
    engine = _busy_engine(url)
    spool = tmp_path / "spool.jsonl"
    try:
        with _sqlite_locked(path):
            writer = InferenceLogWriter(
                engine, migrate=False, batch_size=4, max_backoff_s=0.05, spool_path=spool
            )
            writer.record(finished=[request_stats(i) for i in range(10)])
            _wait_until(lambda: writer.num_retries >= 1, "a failed attempt")
            assert writer.close(timeout=0.2) is False
        # the batch the drain thread held (4) and the queue (6), each once
        assert (writer.num_spilled, writer.num_dropped, writer.num_written) == (10, 0, 0)
        assert writer.num_settled == writer.num_accepted == 10
        assert writer._drainer.num_failed_batches == 1
        assert len(spool.read_text().splitlines()) == 10
    finally:
        engine.dispose()


def test_close_spills_the_queue_when_a_database_call_never_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """close() waits timeout + ATTEMPT_BOUND_S for the call under way, then spills the queue."""
    import storage.writer

    monkeypatch.setattr(storage.writer, "ATTEMPT_BOUND_S", 0.2)
    _, url = _db(tmp_path)
    engine = make_engine(url)
    inside, gate = threading.Event(), threading.Event()

    @event.listens_for(engine, "connect")
    def _hang(_dbapi_conn: Any, _record: Any) -> None:
        inside.set()
        gate.wait(WAIT_S)

    spool = tmp_path / "spool.jsonl"
    before = set(threading.enumerate())
    writer = InferenceLogWriter(engine, migrate=False, spool_path=spool)
    (thread,) = set(threading.enumerate()) - before
    try:
        writer.record(finished=[request_stats(0)])
        assert inside.wait(WAIT_S), "the drain thread never connected"
        writer.record(finished=[request_stats(i) for i in range(1, 6)])
        with caplog.at_level(logging.ERROR, logger="storage.writer"):
            closer = _InThread(lambda: writer.close(timeout=0.1))
            assert closer.join() is False
        assert thread.is_alive()  # still inside the database call
        assert (writer.num_spilled, writer.num_dropped) == (5, 0)
        assert len(spool.read_text().splitlines()) == 5
        assert any("does not return" in r.getMessage() for r in caplog.records)
    finally:
        gate.set()
        thread.join(WAIT_S)
        engine.dispose()
    assert not thread.is_alive()
    engine = make_engine(url)
    assert _stored(engine) == [("req-0", "stop", None)]  # the call did end, later
    engine.dispose()


def test_migrations_that_fail_until_close_log_the_database_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "fresh.db"
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    with engine.connect():
        pass  # the file exists (WAL), without tables
    engine.dispose()
    engine = _busy_engine(url)
    try:
        with _sqlite_locked(path), caplog.at_level(logging.ERROR, logger="storage.drain"):
            writer = InferenceLogWriter(engine, max_backoff_s=0.05)  # migrate=True
            writer.record(finished=[request_stats(0)])
            _wait_until(lambda: writer.num_retries >= 1, "a failed migration attempt")
            assert writer.close(timeout=0.2) is False
        (failed,) = [
            r.getMessage() for r in caplog.records if "migrations failed" in r.getMessage()
        ]
        assert "database is locked" in failed  # the database's error, not tenacity's
        assert writer.num_dropped_by_reason == {"shutdown": 1}
    finally:
        engine.dispose()


# --- the summary close() logs ---------------------------------------------------------------------
def _summary(caplog: pytest.LogCaptureFixture) -> tuple[int, str]:
    (record,) = [r for r in caplog.records if "closed:" in r.getMessage()]
    return record.levelno, record.getMessage()


def test_close_logs_a_clean_summary_at_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, url = _db(tmp_path)
    writer = InferenceLogWriter(url, migrate=False, spool_path=tmp_path / "spool.jsonl")
    try:
        writer.record(finished=[request_stats(i) for i in range(3)])
        with caplog.at_level(logging.INFO, logger="storage.writer"):
            assert writer.close(timeout=WAIT_S)
        assert _summary(caplog) == (
            logging.INFO,
            "inference_log: closed: 3 rows written, 0 spilled, 0 dropped",
        )
    finally:
        writer.engine.dispose()


def test_close_logs_spilled_and_dropped_rows_at_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, url = _db(tmp_path)
    spool = tmp_path / "spool.jsonl"
    writer = InferenceLogWriter(url, migrate=False, autostart=False, queue_size=3, spool_path=spool)
    try:
        writer.record(finished=[request_stats(i) for i in range(5)])
        with caplog.at_level(logging.INFO, logger="storage.writer"):
            assert writer.close(timeout=0) is False
        assert _summary(caplog) == (
            logging.WARNING,
            f"inference_log: closed: 0 rows written, 3 spilled to {spool} (written at the next "
            "start), 2 dropped (queue_full 2)",
        )
    finally:
        writer.engine.dispose()


def test_close_logs_dropped_rows_by_reason_at_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, url = _db(tmp_path)
    writer = InferenceLogWriter(url, migrate=False, autostart=False, queue_size=2)
    try:
        writer.record(finished=[request_stats(i) for i in range(3)])
        with caplog.at_level(logging.INFO, logger="storage.writer"):
            assert writer.close(timeout=0) is False
        assert _summary(caplog) == (
            logging.WARNING,
            "inference_log: closed: 0 rows written, 0 spilled, 3 dropped "
            "(queue_full 1, shutdown 2)",
        )
    finally:
        writer.engine.dispose()


def test_close_logs_spilled_rows_alone_at_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, url = _db(tmp_path)
    spool = tmp_path / "spool.jsonl"
    writer = InferenceLogWriter(url, migrate=False, autostart=False, spool_path=spool)
    try:
        writer.record(finished=[request_stats(0)])
        with caplog.at_level(logging.INFO, logger="storage.writer"):
            assert writer.close(timeout=0) is False
        assert _summary(caplog) == (
            logging.WARNING,
            f"inference_log: closed: 0 rows written, 1 spilled to {spool} (written at the next "
            "start), 0 dropped",
        )
    finally:
        writer.engine.dispose()


def test_an_idle_drain_thread_waits_for_rows_instead_of_spinning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between rows the drain thread blocks on the queue (POLL_S at a time): a thread that polls
    without waiting would burn a whole core while the server is idle. Every queue read of the
    idle thread is a blocking one with a timeout."""
    _, url = _db(tmp_path)
    writer = InferenceLogWriter(url, migrate=False)
    try:
        writer.record(finished=[request_stats(0)])
        assert writer.flush(WAIT_S)
        reads: list[tuple[bool, float | None]] = []
        real_get = writer._queue.get

        def get(block: bool = True, timeout: float | None = None) -> Any:
            reads.append((block, timeout))  # get_nowait() is get(block=False)
            return real_get(block, timeout)

        monkeypatch.setattr(writer._queue, "get", get)
        _wait_until(lambda: len(reads) >= 3, "three reads of the idle drain thread")
        assert all(block and timeout and timeout > 0 for block, timeout in reads[:3]), reads
        monkeypatch.undo()
        assert writer.close(timeout=WAIT_S)
    finally:
        writer.engine.dispose()


def test_a_second_close_after_rows_were_spilled_still_says_not_all_written(
    tmp_path: Path,
) -> None:
    """close() is True only when everything accepted was written; rows left to the spool were
    not, and a second close() must not forget them (it used to answer True)."""
    _, url = _db(tmp_path)
    spool = tmp_path / "spool.jsonl"
    writer = InferenceLogWriter(url, migrate=False, autostart=False, spool_path=spool)
    writer.record(finished=[request_stats(1)])
    assert writer.close(timeout=1) is False
    assert writer.num_spilled == 1 and writer.num_dropped == 0
    assert writer.close(timeout=1) is False
    writer.engine.dispose()
