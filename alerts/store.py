"""Where sampled series live between evaluations. `SampleStore` is the protocol the evaluator
uses; `MemorySampleStore` keeps points in process memory (the default, and the tests' store);
`alerts.sql_store.SqlSampleStore` writes them to the `metric_samples` table.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol

from alerts.promql.types import METRIC_NAME, Labels, Matcher, Series, label_value

# (labels incl. __name__, value); value None = staleness marker (the series vanished)
Point = tuple[Labels, float | None]


class SampleStore(Protocol):
    def append(self, ts: float, points: Sequence[Point]) -> None:
        """Store one sampling round taken at `ts` (seconds since the epoch)."""
        ...

    def select(self, matchers: Sequence[Matcher], start: float, end: float) -> list[Series]:
        """Series matching every matcher, with their points in [start, end], oldest first."""
        ...

    def prune(self, before: float) -> None:
        """Forget points older than `before`."""
        ...


class MemorySampleStore:
    """Per-series sorted point lists indexed by metric name. Thread-safe."""

    def __init__(self) -> None:
        self._times: dict[Labels, list[float]] = {}
        self._values: dict[Labels, list[float | None]] = {}
        self._by_name: dict[str, set[Labels]] = defaultdict(set)
        self._lock = threading.Lock()

    def append(self, ts: float, points: Sequence[Point]) -> None:
        with self._lock:
            for labels, value in points:
                times = self._times.get(labels)
                if times is None:
                    times = self._times[labels] = []
                    self._values[labels] = []
                    self._by_name[label_value(labels, METRIC_NAME)].add(labels)
                if times and ts <= times[-1]:
                    if ts == times[-1]:
                        self._values[labels][-1] = value  # same round twice: last write wins
                    continue  # out of order: ignored, as a TSDB would
                times.append(ts)
                self._values[labels].append(value)

    def select(self, matchers: Sequence[Matcher], start: float, end: float) -> list[Series]:
        name = next((m.value for m in matchers if m.name == METRIC_NAME and m.op == "="), None)
        with self._lock:
            candidates = self._by_name.get(name, set()) if name is not None else self._times.keys()
            out: list[Series] = []
            for labels in sorted(candidates):
                if not all(m.matches(labels) for m in matchers):
                    continue
                times = self._times[labels]
                lo = bisect.bisect_left(times, start)
                hi = bisect.bisect_right(times, end)
                if hi > lo:
                    values = self._values[labels]
                    out.append(Series(labels, list(zip(times[lo:hi], values[lo:hi], strict=True))))
            return out

    def prune(self, before: float) -> None:
        with self._lock:
            for labels in list(self._times):
                times = self._times[labels]
                cut = bisect.bisect_left(times, before)
                if cut:
                    del times[:cut]
                    del self._values[labels][:cut]
                if not times:
                    del self._times[labels], self._values[labels]
                    self._by_name[label_value(labels, METRIC_NAME)].discard(labels)

    def series_count(self) -> int:
        with self._lock:
            return len(self._times)
