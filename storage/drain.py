"""The writer's background thread: take a batch, write it in one transaction, retry with
exponential backoff (tenacity) while the database is unreachable, settle the items (written,
dropped or spilled) so `flush()` can return. A batch refused for its own rows is written row by row
(storage.isolate). On close it keeps retrying until the close deadline, then spills what is left
to the spool (storage.spool), which the next start replays first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    wait_exponential,
    wait_random,
)

from storage.batch import BatchPlan, Item, execute_plan, plan_batch
from storage.db import upgrade
from storage.drain_ports import WriterQueue
from storage.isolate import UNSTORABLE, write_one_by_one
from storage.replay import replay_spool
from storage.rows import Row
from storage.spool import plan_items

log = logging.getLogger(__name__)
T = TypeVar("T")
POLL_S = 0.05  # how long an idle drain thread waits for the first item of a batch


def is_transient(exc: BaseException) -> bool:
    """Connection refused / lost / database locked: worth retrying. Anything else (a bad row, a
    missing column) would fail again, so the batch is written row by row instead."""
    e: BaseException | None = exc
    while e is not None:
        if isinstance(e, (OperationalError, InterfaceError)):
            return True
        if isinstance(e, DBAPIError) and e.connection_invalidated:
            return True
        e = e.__cause__
    return False


class Drainer:
    def __init__(
        self,
        writer: WriterQueue,
        *,
        migrate: bool,
        max_backoff_s: float,
        orphan_timeout_s: float,
    ) -> None:
        self.writer = writer
        self.max_backoff_s = max_backoff_s
        self.orphan_timeout_s = orphan_timeout_s
        self.num_written = 0  # rows inserted
        self.num_retries = 0
        self.num_failed_batches = 0
        # logit probes that arrived before their request row, by request_id (+ arrival time)
        self.orphans: dict[str, Row] = {}
        self.orphan_born: dict[str, float] = {}
        self.strays: list[Row] = []  # a second early logit probe of one request: a plain probe row
        self._needs_migration = migrate
        self._closing = threading.Event()
        self._deadline = float("inf")

    def begin_close(self, deadline: float) -> None:
        self._deadline = deadline
        self._closing.set()

    @property
    def is_past_deadline(self) -> bool:
        return self._closing.is_set() and time.monotonic() >= self._deadline

    def run(self) -> None:
        if self._needs_migration:
            try:
                self._retry(lambda: upgrade(self.writer.engine))
            except Exception as exc:  # keep draining; the tables may exist already
                log.error("inference_log: migrations failed: %s", exc)
        replay_spool(self)  # rows a previous shutdown spilled, before the new ones
        while True:
            closing = self._closing.is_set()
            if self.is_past_deadline and self.writer.num_queued:
                self.drop_all()
            items = self.writer.take(0 if closing else POLL_S)
            if items:
                self._write_items(items)
            now = time.monotonic()
            force = not items and (closing or self.writer.num_flush_waiters > 0)
            aged = [
                r for r, t in self.orphan_born.items() if force or now - t > self.orphan_timeout_s
            ]
            if aged or self.strays:
                self._write_orphans(aged)
            if closing and not items and not self.orphans and not self.writer.num_queued:
                return

    def _write_items(self, items: list[Item]) -> None:
        try:
            plan = plan_batch(items, self.orphans)
        except Exception:  # a malformed row must not kill the thread (and stall every flush)
            log.exception("inference_log: dropping %d malformed rows", len(items))
            self.writer.count_dropped(len(items), UNSTORABLE)
            self.writer.settle(len(items))
            return
        self._write(plan)

    def _write(self, plan: BatchPlan) -> None:
        self.orphan_born = {r: t for r, t in self.orphan_born.items() if r in self.orphans}
        try:
            leftovers = self._retry(lambda: self._transaction(plan))
            num_written = len(plan.inserts)
        except Exception as exc:  # a failed batch is never propagated
            self.num_failed_batches += 1
            if self.is_past_deadline:  # the shutdown's flush ran out: the spool keeps the rows
                self.writer.spill(plan_items(plan))
                self.writer.settle(plan.num_items)
                return
            # refused for a reason of its own rows: store the others, drop only the bad ones
            num_written, leftovers = write_one_by_one(self, plan, exc)
        self.num_written += num_written
        now = time.monotonic()
        for rid, row in leftovers.items():
            if rid in self.orphans:
                self.strays.append(row)
            else:
                self.orphans[rid] = row
                self.orphan_born[rid] = now
        self.writer.settle(plan.num_items - len(leftovers))

    def _write_orphans(self, rids: list[str]) -> None:
        """Logit probes whose request row never came: stored as probe rows (op="logit")."""
        plan = BatchPlan(inserts=[self.orphans.pop(r) for r in rids] + self.strays)
        plan.num_items = len(plan.inserts)
        self.strays = []
        for rid in rids:
            self.orphan_born.pop(rid, None)
        self._write(plan)

    def _transaction(self, plan: BatchPlan) -> dict[str, Row]:
        with self.writer.engine.begin() as conn:
            return execute_plan(conn, plan)

    def drop_all(self) -> None:
        """Close ran out of time: everything still queued goes to the spool (or, without one, is
        counted as dropped)."""
        while items := self.writer.take(0):
            self.writer.spill(items)
            self.writer.settle(len(items))

    def _retry(self, fn: Callable[[], T]) -> T:
        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            wait=wait_exponential(multiplier=0.05, max=self.max_backoff_s) + wait_random(0, 0.05),
            stop=self._should_give_up,
            sleep=self._sleep,
            before_sleep=self._count_retry,
            reraise=True,
        )
        return retrying(fn)

    def _should_give_up(self, _state: RetryCallState) -> bool:
        return self.is_past_deadline

    def _count_retry(self, state: RetryCallState) -> None:
        self.num_retries += 1
        if self.num_retries == 1 or self.num_retries % 20 == 0:
            exc = state.outcome.exception() if state.outcome else None
            log.warning("inference_log: database unavailable (%s); retrying", exc)

    def _sleep(self, seconds: float) -> None:
        if self._closing.is_set():
            time.sleep(max(0.0, min(seconds, self._deadline - time.monotonic())))
        else:
            self._closing.wait(seconds)  # close() cuts a long backoff short
