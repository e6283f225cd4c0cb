"""The `inference_log` sink: `record()` turns stats into rows and puts them on a bounded queue
without waiting (never blocks, never raises); a background thread drains the queue in batched
inserts, retrying with backoff while the database is unreachable. A full queue drops rows and
counts them (`num_dropped`, `on_drop`), so a slow or absent database never slows a request.
Rows still queued when `close()` runs out of time go to the spool (`spool_path`, storage.spool)
and are written at the next start; `close()` logs how many rows were written, spilled, dropped.

Drop reasons (the `reason` passed to `on_drop`): "queue_full" (the queue was full), "unstorable"
(the database refused the row itself), "shutdown" (after close, or no spool to keep it in).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from runtime.engine.stats import RequestStats, StepStats, VerificationResult
from storage.batch import LOGIT, PROBE, REQUEST, Item
from storage.db import make_engine
from storage.drain import Drainer
from storage.rows import LOGIT_OP, probe_row, request_row, server_instance
from storage.spool import Spool, default_spool_path, weight

if TYPE_CHECKING:
    from runtime.config import Settings

log = logging.getLogger(__name__)
QUEUE_FULL, SHUTDOWN = "queue_full", "shutdown"
ATTEMPT_BOUND_S = 10.0  # longer than one blocking database call (busy / connect timeouts: 5 s)
DROP_REASONS = (QUEUE_FULL, "unstorable", SHUTDOWN)
# refused before authentication: counted in the failure metric, never a row (anyone could send them)
UNLOGGED_FAILURES = frozenset({"unauthorized"})


class InferenceLogWriter:
    """A StatsSink. `on_drop(n, reason)` is called (from any thread) when n rows could not be
    stored, e.g. to increment `fastllm_inference_log_dropped_total{reason}`."""

    def __init__(
        self,
        engine: Engine | str,
        *,
        queue_size: int = 10000,
        batch_size: int = 256,
        on_drop: Callable[[int, str], None] | None = None,
        migrate: bool = True,
        max_backoff_s: float = 2.0,
        orphan_timeout_s: float = 60.0,
        autostart: bool = True,
        spool_path: str | Path | None = None,
        instance: str | None = None,
    ) -> None:
        self.instance = instance  # every row's `instance` (host:port of the server writing it)
        self.engine = make_engine(engine) if isinstance(engine, str) else engine
        self.batch_size = batch_size
        self.spool = Spool(spool_path) if spool_path is not None else None
        self._queue: queue.Queue[Item] = queue.Queue(maxsize=queue_size)
        self._on_drop = on_drop
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self.num_accepted = 0  # items put on the queue
        self.num_settled = 0  # items written or dropped by the drain thread
        self.num_dropped = 0  # items never stored: queue full, after close, refused rows
        self.num_dropped_by_reason: Counter[str] = Counter()
        self.num_spilled = 0  # items kept in the spool for the next start
        self.num_replayed = 0  # items of a previous run's spool queued at start
        self.num_flush_waiters = 0
        self._closed = False
        self._drainer = Drainer(
            self, migrate=migrate, max_backoff_s=max_backoff_s, orphan_timeout_s=orphan_timeout_s
        )
        self._thread = threading.Thread(target=self._drainer.run, name="inference-log", daemon=True)
        if autostart:
            self.start()

    @classmethod
    def from_settings(
        cls, settings: Settings, *, on_drop: Callable[[int, str], None] | None = None, **kwargs: Any
    ) -> InferenceLogWriter:
        """database_url, log_queue_size, log_batch_size and the spool from the settings object."""
        spool = settings.log_spool_path or default_spool_path(settings.database_url)
        return cls(
            settings.database_url,
            queue_size=settings.log_queue_size,
            batch_size=settings.log_batch_size,
            on_drop=on_drop,
            spool_path=spool,
            **{"instance": server_instance(settings), **kwargs},
        )

    # --- the StatsSink side: never blocks, never raises -----------------------------------------
    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None:
        try:
            logged = [s for s in finished if s.failure_reason not in UNLOGGED_FAILURES]
            where = self.instance
            items = [Item(REQUEST, request_row(s, where)) for s in logged]
            items += [
                Item(LOGIT if v.op == LOGIT_OP else PROBE, probe_row(v, where)) for v in verified
            ]
            num_lost = 0
            for item in items:
                with self._lock:
                    if self._closed:
                        num_lost += 1
                        continue
                    try:
                        self._queue.put_nowait(item)
                    except queue.Full:
                        num_lost += 1
                        continue
                    self.num_accepted += 1
            if num_lost:
                self.count_dropped(num_lost, SHUTDOWN if self._closed else QUEUE_FULL)
        except Exception:  # a malformed stat must never fail the request
            log.exception("inference_log: could not queue rows")
            self.count_dropped(len(finished) + len(verified), "unstorable")

    def count_dropped(self, n: int, reason: str) -> None:
        with self._lock:
            self.num_dropped += n
            self.num_dropped_by_reason[reason] += n
        if self._on_drop is not None:
            try:
                self._on_drop(n, reason)
            except Exception:  # a metrics hook must not break the writer
                log.exception("inference_log: on_drop hook failed")

    def spill(self, items: Sequence[Item]) -> None:
        """Keep `items` in the spool for the next start (the drain thread at close); counted as
        dropped when there is no spool or it cannot be written. The caller settles them."""
        n = sum(weight(item.row) for item in items)
        if not n:
            return
        if self.spool is not None:
            try:
                self.spool.append(items)
            except OSError as exc:
                log.error("inference_log: cannot spill %d rows to %s: %s", n, self.spool.path, exc)
            else:
                with self._lock:
                    self.num_spilled += n
                return
        self.count_dropped(n, SHUTDOWN)

    def accept_replayed(self, n: int) -> None:
        """`n` spooled items are about to be written like queued ones (flush() waits for them)."""
        with self._lock:
            self.num_accepted += n
            self.num_replayed += n

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        if not self._thread.is_alive():
            self._thread.start()

    @property
    def num_queued(self) -> int:
        return self._queue.qsize()

    @property
    def num_written(self) -> int:
        return self._drainer.num_written

    @property
    def num_retries(self) -> int:
        return self._drainer.num_retries

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every item accepted so far is written (or dropped); True if it got there."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._settled:
            target = self.num_accepted
            self.num_flush_waiters += 1
            try:
                while self.num_settled < target:
                    left = None if deadline is None else deadline - time.monotonic()
                    if (left is not None and left <= 0) or not self._thread.is_alive():
                        return False
                    self._settled.wait(0.05 if left is None else min(left, 0.05))
            finally:
                self.num_flush_waiters -= 1
        return True

    def close(self, timeout: float = 10.0) -> bool:
        """Stop accepting, write what is queued (retrying until `timeout`), spill the rest; logs
        what became of the rows. True when everything accepted was written."""
        with self._lock:
            if self._closed:  # the same answer as the first close gave
                return self._all_written()
            self._closed = True
        self._drainer.begin_close(time.monotonic() + timeout)
        if self._thread.is_alive():
            # the attempt under way when the deadline passes still ends (SQLite's busy timeout,
            # PostgreSQL's connect timeout: 5 s each); only then are its rows spilled
            self._thread.join(timeout + ATTEMPT_BOUND_S)
        if self._thread.is_alive():  # stuck inside the database: keep at least the queued rows
            log.error("inference_log: the database call does not return; spilling the queue")
            self._drainer.drop_all()
        elif self.num_queued:  # never started: nothing will drain the queue
            self._drainer.drop_all()
        self._log_summary()
        with self._lock:
            return self._all_written()

    def _all_written(self) -> bool:
        """Under the lock: every accepted row settled, none dropped and none left to the spool."""
        return (
            self.num_settled >= self.num_accepted
            and self.num_dropped == 0
            and self.num_spilled == 0
        )

    def _log_summary(self) -> None:
        with self._lock:
            dropped = ", ".join(f"{r} {n}" for r, n in sorted(self.num_dropped_by_reason.items()))
            spilled, num_dropped = self.num_spilled, self.num_dropped
        where = (
            f" to {self.spool.path} (written at the next start)" if spilled and self.spool else ""
        )
        level = logging.WARNING if spilled or num_dropped else logging.INFO
        log.log(
            level,
            "inference_log: closed: %d rows written, %d spilled%s, %d dropped%s",
            self.num_written,
            spilled,
            where,
            num_dropped,
            f" ({dropped})" if dropped else "",
        )

    def settle(self, n: int) -> None:
        """Called by the drain thread after a batch is written or dropped."""
        with self._settled:
            self.num_settled += n
            self._settled.notify_all()

    def take(self, block_s: float) -> list[Item]:
        """Up to batch_size items; waits at most `block_s` for the first one."""
        try:
            items = [self._queue.get(timeout=block_s) if block_s > 0 else self._queue.get_nowait()]
        except queue.Empty:
            return []
        while len(items) < self.batch_size:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def __enter__(self) -> InferenceLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
