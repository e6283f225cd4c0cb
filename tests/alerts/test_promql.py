"""Focused checks of the PromQL subset's semantics (the parity tests cover the rules)."""

from __future__ import annotations

import math

import pytest

from alerts.errors import AlertRuleError
from alerts.promql import Evaluator, parse
from alerts.promql.types import make_labels
from alerts.store import MemorySampleStore


def _store(series: dict[str, list[float | None]], step: float = 60.0) -> MemorySampleStore:
    store = MemorySampleStore()
    for text, values in series.items():
        name, _, rest = text.partition("{")
        pairs = [p.split("=") for p in rest.rstrip("}").split(",") if p]
        labels = make_labels({"__name__": name, **{k: v.strip('"') for k, v in pairs}})
        for i, v in enumerate(values):
            store.append(i * step, [(labels, v)])
    return store


def _eval(store, expr: str, t: float):
    return Evaluator(store).instant(parse(expr), t)


def test_rate_extrapolates_to_the_window_edges() -> None:
    # samples at 0..4m of a counter rising 60/min; window [1m, 5m] holds 4 samples spanning 3m
    # and ending 1m before the window end (< 1.1 x 1m): extrapolated to the full 4m
    store = _store({"c_total": [0, 60, 120, 180, 240]})
    [sample] = _eval(store, "increase(c_total[4m])", 300.0)
    assert sample.value == pytest.approx(240.0)
    [sample] = _eval(store, "rate(c_total[4m])", 300.0)
    assert sample.value == pytest.approx(1.0)


def test_counter_resets_are_added_back() -> None:
    store = _store({"c_total": [10, 20, 5, 15]})
    [sample] = _eval(store, "increase(c_total[3m])", 180.0)
    # 20 before the reset + 15 after, minus the first 10 = 25 over the 3m sampled exactly
    assert sample.value == pytest.approx(25.0)


def test_deriv_and_predict_linear_are_least_squares() -> None:
    store = _store({"g": [1, 3, 5, 7]})
    [d] = _eval(store, "deriv(g[3m])", 180.0)
    assert d.value == pytest.approx(2 / 60)
    [p] = _eval(store, "predict_linear(g[3m], 60)", 180.0)
    assert p.value == pytest.approx(9.0)


def test_binary_matching_and_set_operators() -> None:
    store = _store(
        {
            'a{x="1",y="p"}': [10.0],
            'a{x="2",y="p"}': [20.0],
            'b{x="1",y="q"}': [2.0],
            'b{x="2",y="q"}': [4.0],
        }
    )
    result = _eval(store, "a / on(x) b", 0.0)
    assert sorted((s.labels, s.value) for s in result) == [
        ((("x", "1"),), 5.0),
        ((("x", "2"),), 5.0),
    ]
    assert _eval(store, "a / b", 0.0) == []  # y differs: no match without on()
    kept = _eval(store, "a > 15 or b", 0.0)
    assert sorted(s.value for s in kept) == [2.0, 4.0, 20.0]
    assert [s.value for s in _eval(store, "a unless on(x) (b > 3)", 0.0)] == [10.0]
    assert [s.value for s in _eval(store, "sum by (y) (a)", 0.0)] == [30.0]
    assert [s.value for s in _eval(store, "a > bool 15", 0.0)] == [0.0, 1.0]


def test_lookback_staleness_and_absent() -> None:
    store = _store({'up{job="x"}': [1.0, None], 'other{job="y"}': [1.0]})
    assert _eval(store, 'up{job="x"}', 0.0)[0].value == 1.0
    assert _eval(store, 'up{job="x"}', 60.0) == []  # staleness marker
    [absent] = _eval(store, 'absent(up{job="x"})', 60.0)
    assert absent.labels == (("job", "x"),)
    assert _eval(store, 'other{job="y"}', 300.0)[0].value == 1.0  # lookback is inclusive
    assert _eval(store, 'other{job="y"}', 300.001) == []


def test_division_by_zero_follows_ieee() -> None:
    store = _store({"z": [0.0], "o": [1.0]})
    assert math.isnan(_eval(store, "z / z", 0.0)[0].value)
    assert _eval(store, "o / z", 0.0)[0].value == math.inf


@pytest.mark.parametrize(
    "expr",
    ["1 > 0", "rate(x)", "sum(x[5m])", "x offset", "{}", "x[5m:1m]", "topk(3, x)", "x and 1"],
)
def test_parse_errors(expr: str) -> None:
    with pytest.raises(AlertRuleError):
        parse(expr)
