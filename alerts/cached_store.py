"""A durable SampleStore (SQL) with the samples this process took also kept in memory.

Every round goes to both. A read that starts after this process's first round is answered from
memory (the same points, with none of the SQL round trip and row decoding: 10-30x faster on
SQLite); a read reaching further back, into a previous run's history, goes to the durable store.
The rules and the status page's panels read through it; `metric_samples` still gets every point.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from alerts.promql.types import Matcher, Series
from alerts.store import MemorySampleStore, Point, SampleStore


class CachedSampleStore:
    def __init__(self, durable: SampleStore) -> None:
        self.durable = durable
        self.memory = MemorySampleStore()
        self._first_ts: float | None = None
        self._lock = threading.Lock()

    def append(self, ts: float, points: Sequence[Point]) -> None:
        self.durable.append(ts, points)  # first: a failing database write fails the round
        self.memory.append(ts, points)
        with self._lock:
            if self._first_ts is None:
                self._first_ts = ts

    def select(self, matchers: Sequence[Matcher], start: float, end: float) -> list[Series]:
        with self._lock:
            first = self._first_ts
        if first is not None and start >= first:
            return self.memory.select(matchers, start, end)
        return self.durable.select(matchers, start, end)

    def prune(self, before: float) -> None:
        self.durable.prune(before)
        self.memory.prune(before)
