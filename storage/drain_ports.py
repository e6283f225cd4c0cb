"""What the drain thread's parts see of each other, as protocols: the writer's queue side
(storage.writer.InferenceLogWriter implements WriterQueue) and the drainer's write side
(storage.drain.Drainer implements DrainerPort, used by storage.isolate and storage.replay).
Protocols here keep writer, drain, isolate and replay free of import cycles."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from storage.batch import BatchPlan, Item
    from storage.rows import Row
    from storage.spool import Spool

T = TypeVar("T")


class WriterQueue(Protocol):
    engine: Engine
    spool: Spool | None
    batch_size: int

    @property
    def num_queued(self) -> int: ...

    @property
    def num_flush_waiters(self) -> int: ...

    def take(self, block_s: float) -> list[Item]: ...

    def count_dropped(self, n: int, reason: str) -> None: ...

    def spill(self, items: Sequence[Item]) -> None: ...

    def accept_replayed(self, n: int) -> None: ...

    def settle(self, n: int) -> None: ...


class DrainerPort(Protocol):
    writer: WriterQueue

    @property
    def is_past_deadline(self) -> bool: ...

    def _retry(self, fn: Callable[[], T]) -> T: ...

    def _transaction(self, plan: BatchPlan) -> dict[str, Row]: ...

    def _write_items(self, items: list[Item]) -> None: ...
