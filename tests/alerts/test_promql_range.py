"""Range queries (alerts/promql/range.py): by definition the instant query at every step; the
windowed reads and the per-step memo must not change a single value."""

from __future__ import annotations

import math

import pytest

from alerts.errors import AlertRuleError
from alerts.promql import Evaluator, parse
from alerts.promql.range import MAX_POINTS, evaluate_range, step_times
from alerts.promql.scale import selectors
from alerts.promql.types import Sample, make_labels
from alerts.store import MemorySampleStore

EXPRESSIONS = [
    "histogram_quantile(0.9, sum by (le) (rate(lat_bucket[2m])))",
    'sum by (model) (rate(done_total{model=~".*"}[90s]))',
    "predict_linear(mem[5m], 3600) / 1000",
    "count(not_there) or vector(0)",
    "time() - 1",  # a scalar: one series without labels
    "max_over_time(mem[3m] offset 1m)",
    "mem - mem offset 2m",  # instant selectors: the lookback reaches before the window
]
LOOKBACK_S = 60.0


def _store() -> MemorySampleStore:
    """Irregular 10-20 s samples over 20 minutes: counters with a reset, a gauge, buckets."""
    store = MemorySampleStore()
    t, i = 0.0, 0
    while t < 1200:
        points = []
        for model, speed in (("a", 3), ("b", 5)):
            count = (i * speed) % 400  # resets every so often
            points.append((make_labels({"__name__": "done_total", "model": model}), float(count)))
        for le, share in (("0.1", 0.2), ("0.5", 0.7), ("1", 0.9), ("+Inf", 1.0)):
            labels = make_labels({"__name__": "lat_bucket", "le": le})
            points.append((labels, math.floor(i * 10 * share)))
        points.append((make_labels({"__name__": "mem"}), 100.0 + 3 * i + (i % 4) * 10))
        store.append(t, points)
        i += 1
        t += 10.0 + (i % 3) * 5.0
    return store


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_a_range_is_the_instant_query_at_every_step(text: str) -> None:
    store, expr = _store(), parse(text)
    rows = evaluate_range(store, expr, 300.0, 1100.0, 37.0, lookback_s=LOOKBACK_S)
    engine = Evaluator(store, lookback_s=LOOKBACK_S)
    expected: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    for t in step_times(300.0, 1100.0, 37.0):
        value = engine.instant(expr, t)
        for s in [Sample((), value)] if isinstance(value, float) else value:
            expected.setdefault(s.labels, []).append((t, s.value))
    assert rows, text
    got = {s.labels: s.points for s in rows}
    assert got.keys() == expected.keys()
    for labels, points in expected.items():
        assert [p[0] for p in got[labels]] == [p[0] for p in points]
        for (_, a), (_, b) in zip(got[labels], points, strict=True):
            assert a == b or (math.isnan(a) and math.isnan(b)), (text, labels)


def test_settled_steps_come_from_the_memo_and_the_rest_are_evaluated() -> None:
    store, expr = _store(), parse("max_over_time(mem[3m])")
    memo: dict[float, list[Sample]] = {}
    first = evaluate_range(
        store, expr, 600.0, 900.0, 60.0, lookback_s=300.0, memo=memo, settled_before=800.0
    )
    assert sorted(memo) == [600.0, 660.0, 720.0, 780.0]  # only steps the store cannot change
    # a planted value proves the memo is read for settled steps, and not for later ones
    memo[660.0] = [Sample((), -1.0)]
    memo[900.0] = [Sample((), -2.0)]
    again = evaluate_range(
        store, expr, 600.0, 900.0, 60.0, lookback_s=300.0, memo=memo, settled_before=800.0
    )
    values = dict(again[0].points)
    assert values[660.0] == -1.0
    assert values[900.0] == dict(first[0].points)[900.0] != -2.0


def test_ranges_prometheus_refuses() -> None:
    with pytest.raises(AlertRuleError, match="before start"):
        step_times(10.0, 5.0, 1.0)
    with pytest.raises(AlertRuleError, match="zero or negative"):
        step_times(0.0, 5.0, 0.0)
    with pytest.raises(AlertRuleError, match="maximum resolution"):
        step_times(0.0, float(MAX_POINTS + 1), 1.0)
    assert len(step_times(0.0, float(MAX_POINTS), 1.0)) == MAX_POINTS + 1  # as Prometheus allows
    assert step_times(0.0, 1.0, 0.3) == [0.0, 0.3, 0.6, 0.9]  # whole milliseconds


def test_duplicate_label_sets_are_an_error_as_in_prometheus() -> None:
    store = _store()
    store.append(1200.0, [(make_labels({"__name__": "mem2"}), 1.0)])
    store.append(1200.0, [(make_labels({"__name__": "mem"}), 2.0)])
    # both lose their name: two samples labelled {} ("vector cannot contain metrics with the
    # same labelset" in Prometheus)
    expr = parse('abs({__name__=~"mem|mem2"})')
    with pytest.raises(AlertRuleError, match="same labelset"):
        evaluate_range(store, expr, 1200.0, 1200.0, 60.0, lookback_s=300.0)


class _CountingStore:
    def __init__(self, store: MemorySampleStore) -> None:
        self.store, self.num_reads = store, 0

    def select(self, matchers, start, end):  # type: ignore[no-untyped-def]
        self.num_reads += 1
        return self.store.select(matchers, start, end)


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_each_selector_is_read_once_for_the_whole_range(text: str) -> None:
    # the windowed source answers every step from one read (a step outside it would fall back
    # to the store: right values, but a read per step)
    store = _CountingStore(_store())
    expr = parse(text)
    evaluate_range(store, expr, 300.0, 1100.0, 37.0, lookback_s=LOOKBACK_S)
    distinct = {sel.matchers for sel in selectors(expr)}  # `mem` and `mem offset 2m`: one read
    assert store.num_reads == len(distinct), text
