"""A SampleStore on the `metric_samples` table (storage.store.MetricStore), so the embedded
evaluator's history survives a restart and can be inspected with SQL. Staleness markers are
not rows (the column is NOT NULL and a marker only matters to the running process): they are
kept in memory beside the table."""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timezone

from sqlalchemy import delete

from alerts.errors import AlertRuleError
from alerts.promql.types import METRIC_NAME, Labels, Matcher, Series, label_value, make_labels
from alerts.store import Point
from storage.models import MetricSample
from storage.store import MetricStore, Sample


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc)


class SqlSampleStore:
    def __init__(self, store: MetricStore) -> None:
        self.store = store
        self._stale: dict[Labels, list[float]] = defaultdict(list)
        self._lock = threading.Lock()

    def append(self, ts: float, points: Sequence[Point]) -> None:
        rows: list[Sample] = []
        for labels, value in points:
            if value is None:
                with self._lock:
                    self._stale[labels].append(ts)
                continue
            name = label_value(labels, METRIC_NAME)
            rest = {k: v for k, v in labels if k != METRIC_NAME}
            rows.append(Sample(name=name, value=value, ts=_dt(ts), labels=rest))
        self.store.add_samples(rows)

    def select(self, matchers: Sequence[Matcher], start: float, end: float) -> list[Series]:
        name = next((m.value for m in matchers if m.name == METRIC_NAME and m.op == "="), None)
        if name is None:
            raise AlertRuleError("the SQL sample store needs a metric name in every selector")
        points: dict[Labels, list[tuple[float, float | None]]] = defaultdict(list)
        for s in self.store.samples(name, since=_dt(start), until=_dt(end)):
            labels = make_labels({**s.labels, METRIC_NAME: s.name})
            points[labels].append((s.ts.timestamp(), s.value))
        with self._lock:
            for labels, times in self._stale.items():
                if label_value(labels, METRIC_NAME) == name:
                    lo, hi = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
                    points[labels].extend((t, None) for t in times[lo:hi])
        out = []
        for labels in sorted(points):
            if all(m.matches(labels) for m in matchers):
                out.append(Series(labels, sorted(points[labels], key=lambda p: p[0])))
        return out

    def prune(self, before: float) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(delete(MetricSample).where(MetricSample.ts < _dt(before)))
        with self._lock:
            for labels in list(self._stale):
                times = [t for t in self._stale[labels] if t >= before]
                if times:
                    self._stale[labels] = times
                else:
                    del self._stale[labels]
