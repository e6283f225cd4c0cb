"""Range queries, as Prometheus' /api/v1/query_range defines them: the expression evaluated as
an instant query at start, start + step, ... <= end, the samples of each output series collected
into one matrix row.

Evaluating at N steps would read the store N times per selector; `_WindowedSource` reads each
selector once for the whole range (plus the expression's reach) and answers the per-step windows
from memory, so a 120-step panel costs one store read per selector (a SQL round trip on
`metric_samples`), not 120. A caller refreshing the same query (a dashboard panel every few
seconds) passes a memo, and only the steps the store can still change are evaluated again.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import MutableMapping, Sequence

from alerts.errors import AlertRuleError
from alerts.promql import ast
from alerts.promql.budget import QueryBudget, unlimited
from alerts.promql.engine import Evaluator, SeriesSource
from alerts.promql.scale import max_window_s
from alerts.promql.types import Labels, Matcher, Sample, Series, Vector

MAX_POINTS = 11_000  # Prometheus' limit per series ("exceeded maximum resolution")


class _WindowedSource:
    def __init__(self, source: SeriesSource, start: float, end: float, budget: QueryBudget) -> None:
        self.source = source
        self.start, self.end = start, end
        self.budget = budget
        self._cache: dict[tuple[Matcher, ...], list[tuple[Series, list[float]]]] = {}

    def _read(self, matchers: Sequence[Matcher], start: float, end: float) -> list[Series]:
        self.budget.check()
        read = self.source.select(matchers, start, end)
        self.budget.spend(sum(len(s.points) for s in read))
        return read

    def select(self, matchers: Sequence[Matcher], start: float, end: float) -> list[Series]:
        if start < self.start or end > self.end:  # outside what was read: ask the store
            return self._read(matchers, start, end)
        key = tuple(matchers)
        found = self._cache.get(key)
        if found is None:
            read = self._read(matchers, self.start, self.end)
            found = self._cache[key] = [(s, [t for t, _ in s.points]) for s in read]
        out: list[Series] = []
        for series, times in found:
            lo, hi = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
            if hi > lo:
                out.append(Series(series.labels, series.points[lo:hi]))
        return out


def step_times(start: float, end: float, step: float) -> list[float]:
    """start, start + step, ... <= end; AlertRuleError on a range Prometheus refuses."""
    if end < start:
        raise AlertRuleError("end timestamp must not be before start time")
    if step <= 0:
        raise AlertRuleError("zero or negative query resolution step widths are not accepted")
    if (end - start) / step > MAX_POINTS:
        raise AlertRuleError(
            f"exceeded maximum resolution of {MAX_POINTS:,} points per timeseries; "
            "try decreasing the query resolution (?step=XX)"
        )
    count = int((end - start) // step) + 1
    return [round(start + i * step, 3) for i in range(count)]  # ms, as Prometheus


def evaluate_range(
    source: SeriesSource,
    expr: ast.Expr,
    start: float,
    end: float,
    step: float,
    *,
    lookback_s: float,
    memo: MutableMapping[float, Vector] | None = None,
    settled_before: float = -math.inf,
    budget: QueryBudget | None = None,
) -> list[Series]:
    """One Series per output label set, points in time order (a scalar expression yields one
    series with no labels). Steps where a series has no sample are simply absent.

    `memo`: results of earlier evaluations of this same expression by step time. A step before
    `settled_before` (a time the store has a later round than) can no longer change, so it is
    taken from the memo when there and stored in it when computed.

    `budget`: raises QueryTimeoutError / TooManySamplesError when spent (default: unlimited)."""
    budget = budget if budget is not None else unlimited()
    times = step_times(start, end, step)
    memo = memo if memo is not None else {}
    todo = [t for t in times if not (t < settled_before and t in memo)]
    reach = max_window_s(expr) + lookback_s
    window_start = (todo[0] if todo else end) - reach
    windowed = _WindowedSource(source, window_start, end, budget)
    engine = Evaluator(windowed, lookback_s=lookback_s)
    rows: dict[Labels, list[tuple[float, float | None]]] = {}
    for t in times:
        samples = memo.get(t) if t < settled_before else None
        if samples is None:
            samples = _step(engine, expr, t)
            if t < settled_before:
                memo[t] = samples
        budget.spend(len(samples))
        for s in samples:
            rows.setdefault(s.labels, []).append((t, s.value))
    return [Series(labels, points) for labels, points in rows.items()]


def _step(engine: Evaluator, expr: ast.Expr, t: float) -> Vector:
    value = engine.instant(expr, t)
    samples = [Sample((), value)] if isinstance(value, float) else value
    if len({s.labels for s in samples}) < len(samples):
        raise AlertRuleError("vector cannot contain metrics with the same labelset")
    return samples
