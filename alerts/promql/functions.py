"""The functions of the subset, following Prometheus 2.x (promql/functions.go) semantics:
extrapolated rate/increase, least-squares deriv/predict_linear, *_over_time, absent."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from alerts.promql import ast
from alerts.promql.histogram import histogram_quantile
from alerts.promql.types import METRIC_NAME, Labels, Sample, Series, Vector, drop_name

# name -> (argument types, result type)
SIGNATURES: dict[str, tuple[tuple[str, ...], str]] = {
    "rate": (("matrix",), "vector"),
    "increase": (("matrix",), "vector"),
    "delta": (("matrix",), "vector"),
    "deriv": (("matrix",), "vector"),
    "predict_linear": (("matrix", "scalar"), "vector"),
    "avg_over_time": (("matrix",), "vector"),
    "min_over_time": (("matrix",), "vector"),
    "max_over_time": (("matrix",), "vector"),
    "sum_over_time": (("matrix",), "vector"),
    "count_over_time": (("matrix",), "vector"),
    "absent": (("vector",), "vector"),
    "abs": (("vector",), "vector"),
    "clamp_min": (("vector", "scalar"), "vector"),
    "clamp_max": (("vector", "scalar"), "vector"),
    "time": ((), "scalar"),
    "vector": (("scalar",), "vector"),
    "scalar": (("vector",), "scalar"),
    "histogram_quantile": (("scalar", "vector"), "vector"),
}


@dataclass(frozen=True)
class CallContext:
    t: float  # evaluation time, seconds
    args: tuple[ast.Expr, ...]  # the unevaluated arguments (ranges, offsets, matchers)


Points = list[tuple[float, float]]


def _extrapolated(points: Points, ctx: CallContext, *, is_counter: bool, is_rate: bool) -> float:
    """Prometheus' extrapolatedRate: the delta between first and last sample (corrected for
    counter resets), extrapolated towards the range boundaries unless a boundary is further
    than 1.1 average sample intervals away (then by half an interval only)."""
    matrix = ctx.args[0]
    assert isinstance(matrix, ast.MatrixSelector)
    range_end = ctx.t - matrix.selector.offset_s
    range_start = range_end - matrix.range_s
    (first_t, first_v), (last_t, last_v) = points[0], points[-1]
    result = last_v - first_v
    if is_counter:
        previous = first_v
        for _, value in points[1:]:
            if value < previous:
                result += previous  # a reset: the counter restarted from zero
            previous = value
    to_start = first_t - range_start
    to_end = range_end - last_t
    sampled = last_t - first_t
    average_step = sampled / (len(points) - 1)
    if is_counter and result > 0 and first_v >= 0:
        # never extrapolate a counter below zero
        to_start = min(to_start, sampled * (first_v / result))
    threshold = average_step * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average_step / 2
    interval += to_end if to_end < threshold else average_step / 2
    # one factor, as Prometheus computes it (its rounding, bit for bit: promtool compares exactly)
    factor = interval / sampled
    if is_rate:
        factor /= matrix.range_s
    return result * factor


def _regression(points: Points, intercept_t: float) -> tuple[float, float]:
    """Least-squares (slope, intercept at intercept_t) as Prometheus' linearRegression."""
    first = points[0][1]
    if all(v == first for _, v in points):
        return (math.nan, math.nan) if math.isinf(first) else (0.0, first)
    n = float(len(points))
    xs = [t - intercept_t for t, _ in points]
    ys = [v for _, v in points]
    sum_x, sum_y = math.fsum(xs), math.fsum(ys)
    sum_xy = math.fsum(x * y for x, y in zip(xs, ys, strict=True))
    sum_x2 = math.fsum(x * x for x in xs)
    cov_xy = sum_xy - sum_x * sum_y / n
    var_x = sum_x2 - sum_x * sum_x / n
    slope = cov_xy / var_x if var_x else math.nan
    return slope, sum_y / n - slope * sum_x / n


def _over_range(
    series: Sequence[Series],
    ctx: CallContext,
    fn: Callable[[Points], float | None],
    min_points: int,
) -> Vector:
    out: Vector = []
    for s in series:
        points: Points = [(t, v) for t, v in s.points if v is not None]
        if len(points) >= min_points:
            value = fn(points)
            if value is not None:
                out.append(Sample(drop_name(s.labels), value))
    return out


def _values(points: Points) -> list[float]:
    return [v for _, v in points]


def _map(vector: Vector, fn: Callable[[float], float]) -> Vector:
    return [Sample(drop_name(s.labels), fn(s.value)) for s in vector]


def _absent(vector: Vector, ctx: CallContext) -> Vector:
    if vector:
        return []
    labels: dict[str, str] = {}
    arg = ctx.args[0]
    if isinstance(arg, ast.VectorSelector):
        equal = [m for m in arg.matchers if m.op == "=" and m.name != METRIC_NAME]
        for m in equal:
            # a label given twice with "=" cannot be known; Prometheus leaves it out
            if sum(1 for other in equal if other.name == m.name) == 1:
                labels[m.name] = m.value
    label_set: Labels = tuple(sorted(labels.items()))
    return [Sample(label_set, 1.0)]


def call(name: str, args: list[Any], ctx: CallContext) -> float | Vector:
    """Apply function `name` to evaluated args (matrix args are lists of Series)."""
    if name in ("rate", "increase", "delta"):
        counter, is_rate = name != "delta", name == "rate"
        return _over_range(
            args[0],
            ctx,
            lambda p: _extrapolated(p, ctx, is_counter=counter, is_rate=is_rate),
            2,
        )
    if name == "deriv":
        return _over_range(args[0], ctx, lambda p: _regression(p, p[0][0])[0], 2)
    if name == "predict_linear":
        horizon = float(args[1])

        def predict(p: Points) -> float:
            slope, intercept = _regression(p, ctx.t)
            return slope * horizon + intercept

        return _over_range(args[0], ctx, predict, 2)
    over_time: dict[str, Callable[[Points], float]] = {
        "avg_over_time": lambda p: math.fsum(_values(p)) / len(p),
        "min_over_time": lambda p: _nan_min(_values(p)),
        "max_over_time": lambda p: _nan_max(_values(p)),
        "sum_over_time": lambda p: math.fsum(_values(p)),
        "count_over_time": lambda p: float(len(p)),
    }
    if name in over_time:
        return _over_range(args[0], ctx, over_time[name], 1)
    if name == "absent":
        return _absent(args[0], ctx)
    if name == "abs":
        return _map(args[0], abs)
    if name == "clamp_min":
        return _map(args[0], lambda v: max(v, float(args[1])))
    if name == "clamp_max":
        return _map(args[0], lambda v: min(v, float(args[1])))
    if name == "time":
        return ctx.t
    if name == "vector":
        return [Sample((), float(args[0]))]
    if name == "scalar":
        return args[0][0].value if len(args[0]) == 1 else math.nan
    if name == "histogram_quantile":
        return histogram_quantile(float(args[0]), args[1])
    raise AssertionError(f"unhandled function {name}")  # the parser rejects unknown names


def _nan_min(values: list[float]) -> float:
    # Prometheus: NaN only when every value is NaN
    real = [v for v in values if not math.isnan(v)]
    return min(real) if real else math.nan


def _nan_max(values: list[float]) -> float:
    real = [v for v in values if not math.isnan(v)]
    return max(real) if real else math.nan
