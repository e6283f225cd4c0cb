"""Evaluates a parsed expression at one instant against a sample store."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol

from alerts.promql import ast, binops, functions
from alerts.promql.types import LOOKBACK_S, METRIC_NAME, Labels, Matcher, Sample, Series, Value
from alerts.promql.types import Vector as VectorT


class SeriesSource(Protocol):
    def select(self, matchers: Sequence[Matcher], start: float, end: float) -> list[Series]:
        """Series matching all matchers with their points in [start, end] (stale markers as
        None values), oldest first."""
        ...


class Evaluator:
    """Instant-query evaluation. Windows are closed at both ends, as in Prometheus 2.x."""

    def __init__(self, source: SeriesSource, lookback_s: float = LOOKBACK_S) -> None:
        self.source = source
        self.lookback_s = lookback_s

    def instant(self, expr: ast.Expr, t: float) -> Value:
        if isinstance(expr, ast.NumberLiteral):
            return expr.value
        if isinstance(expr, ast.VectorSelector):
            return self._instant_selector(expr, t)
        if isinstance(expr, ast.Call):
            args: list[Any] = [
                self._range(a, t) if isinstance(a, ast.MatrixSelector) else self.instant(a, t)
                for a in expr.args
            ]
            return functions.call(expr.func, args, functions.CallContext(t, expr.args))
        if isinstance(expr, ast.Aggregation):
            inner = self.instant(expr.expr, t)
            assert isinstance(inner, list)
            return aggregate(expr, inner)
        if isinstance(expr, ast.Unary):
            value = self.instant(expr.expr, t)
            if expr.op == "+":
                return value
            if isinstance(value, float):
                return -value
            return [Sample(_drop(s.labels), -s.value) for s in value]
        if isinstance(expr, ast.BinaryExpr):
            return binops.apply(expr, self.instant(expr.lhs, t), self.instant(expr.rhs, t))
        raise TypeError(f"cannot evaluate {type(expr).__name__} as an instant value")

    def _instant_selector(self, sel: ast.VectorSelector, t: float) -> VectorT:
        ref = t - sel.offset_s
        out: VectorT = []
        for series in self.source.select(sel.matchers, ref - self.lookback_s, ref):
            if series.points:
                _, value = series.points[-1]
                if value is not None:  # newest point a staleness marker: the series is gone
                    out.append(Sample(series.labels, value))
        return out

    def _range(self, ms: ast.MatrixSelector, t: float) -> list[Series]:
        end = t - ms.selector.offset_s
        found = self.source.select(ms.selector.matchers, end - ms.range_s, end)
        return [Series(s.labels, [p for p in s.points if p[1] is not None]) for s in found]


def _drop(labels: Labels) -> Labels:
    return tuple(p for p in labels if p[0] != METRIC_NAME)


def aggregate(expr: ast.Aggregation, vector: VectorT) -> VectorT:
    groups: dict[Labels, list[float]] = defaultdict(list)
    for s in vector:
        if expr.without:
            skip = {*expr.grouping, METRIC_NAME}
            key = tuple(p for p in s.labels if p[0] not in skip)
        else:
            key = tuple(p for p in s.labels if p[0] in expr.grouping)
        groups[key].append(s.value)
    out: VectorT = []
    for key, values in groups.items():
        if expr.op == "sum":
            value = math.fsum(values)
        elif expr.op == "avg":
            value = math.fsum(values) / len(values)
        elif expr.op == "count":
            value = float(len(values))
        else:
            real = [v for v in values if not math.isnan(v)]
            pick = min if expr.op == "min" else max
            value = pick(real) if real else math.nan
        out.append(Sample(key, value))
    return out
