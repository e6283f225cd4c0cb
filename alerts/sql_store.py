"""A SampleStore on the `metric_samples` table (storage.store.MetricStore), so the embedded
evaluator's history survives a restart and can be inspected with SQL. Staleness markers are
not rows (the column is NOT NULL and a marker only matters to the running process): they are
kept in memory beside the table.

Several servers may share one database. `instances` scopes the store to the targets its own
evaluator samples: samples of any other instance are never selected, so a server does not
alert about others (running or long stopped). And as a Prometheus scrape does for a series that
stopped being reported, a stored series this process never reported (one a previous process of
the same instance left) goes stale at this process's first sampling round."""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Collection, Sequence
from datetime import datetime, timezone

from sqlalchemy import delete

from alerts.errors import AlertRuleError
from alerts.promql.types import METRIC_NAME, Labels, Matcher, Series, label_value, make_labels
from alerts.store import Point
from storage.models import MetricSample
from storage.store import MetricStore, Sample

# what a datetime holds (years 1 to 9999): a window reaching past it (a query at year 9999 with a
# 292y range) reads to the edge instead of failing in the conversion
_MIN_TS, _MAX_TS = -62135596800.0, 253402300799.0


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(min(max(ts, _MIN_TS), _MAX_TS), timezone.utc)


class SqlSampleStore:
    def __init__(self, store: MetricStore, *, instances: Collection[str] | None = None) -> None:
        self.store = store
        self.instances = frozenset(instances) if instances is not None else None  # None: all
        self._stale: dict[Labels, list[float]] = defaultdict(list)
        self._reported: set[Labels] = set()  # series this process appended a value for
        self._first_ts: float | None = None  # this process's first round
        self._lock = threading.Lock()

    def append(self, ts: float, points: Sequence[Point]) -> None:
        rows: list[Sample] = []
        with self._lock:
            if self._first_ts is None:
                self._first_ts = ts
            self._reported.update(labels for labels, value in points if value is not None)
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
            if self.instances is not None and s.labels.get("instance") not in self.instances:
                continue  # another server's samples: not ours to evaluate
            labels = make_labels({**s.labels, METRIC_NAME: s.name})
            points[labels].append((s.ts.timestamp(), s.value))
        with self._lock:
            for labels, times in self._stale.items():
                if label_value(labels, METRIC_NAME) == name:
                    lo, hi = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
                    points[labels].extend((t, None) for t in times[lo:hi])
            first = self._first_ts
            if first is not None and start <= first <= end:
                for labels in points.keys() - self._reported:  # left by an earlier process
                    if max(t for t, _ in points[labels]) < first:
                        points[labels].append((first, None))
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
