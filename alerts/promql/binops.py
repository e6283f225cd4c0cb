"""Binary operators: scalar/vector arithmetic and comparisons, one-to-one vector matching with
on()/ignoring(), and the set operators, as Prometheus 2.x evaluates them."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

from alerts.errors import AlertRuleError
from alerts.promql import ast
from alerts.promql.types import METRIC_NAME, Labels, Sample, Value, Vector, drop_name


def _div(a: float, b: float) -> float:
    if b == 0:
        return (
            math.nan
            if a == 0 or math.isnan(a)
            else math.copysign(math.inf, a) * (math.copysign(1.0, b))
        )
    return a / b


def _mod(a: float, b: float) -> float:
    return math.nan if b == 0 else math.fmod(a, b)


def _pow(a: float, b: float) -> float:
    try:
        return float(math.pow(a, b))
    except (OverflowError, ValueError):
        return math.inf if a > 0 else math.nan


ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _div,
    "%": _mod,
    "^": _pow,
}
COMPARISON: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
}


def scalar_op(op: str, a: float, b: float) -> float:
    if op in ARITHMETIC:
        return ARITHMETIC[op](a, b)
    return 1.0 if COMPARISON[op](a, b) else 0.0  # scalar comparisons always carry bool


def _element(op: str, a: float, b: float, return_bool: bool) -> tuple[float, bool]:
    """(value, keep) for one pair; comparisons filter unless `bool`."""
    if op in ARITHMETIC:
        return ARITHMETIC[op](a, b), True
    hit = COMPARISON[op](a, b)
    if return_bool:
        return (1.0 if hit else 0.0), True
    return a, hit


def vector_scalar(expr: ast.BinaryExpr, vector: Vector, scalar: float, swap: bool) -> Vector:
    out: Vector = []
    for s in vector:
        lhs, rhs = (scalar, s.value) if swap else (s.value, scalar)
        value, keep = _element(expr.op, lhs, rhs, expr.return_bool)
        if expr.op in COMPARISON and not expr.return_bool:
            value = s.value  # a filter keeps the vector's value even when it is on the right
        if keep:
            drop = expr.op in ARITHMETIC or expr.return_bool
            out.append(Sample(drop_name(s.labels) if drop else s.labels, value))
    return out


def signature(labels: Labels, matching: ast.VectorMatching) -> Labels:
    """The labels two samples must share to match; __name__ never takes part."""
    if matching.on:
        wanted = set(matching.labels)
        return tuple(p for p in labels if p[0] in wanted)
    skip = {*matching.labels, METRIC_NAME}
    return tuple(p for p in labels if p[0] not in skip)


def set_op(expr: ast.BinaryExpr, lhs: Vector, rhs: Vector) -> Vector:
    rhs_sigs = {signature(s.labels, expr.matching) for s in rhs}
    if expr.op == "and":
        return [s for s in lhs if signature(s.labels, expr.matching) in rhs_sigs]
    if expr.op == "unless":
        return [s for s in lhs if signature(s.labels, expr.matching) not in rhs_sigs]
    lhs_sigs = {signature(s.labels, expr.matching) for s in lhs}
    return lhs + [s for s in rhs if signature(s.labels, expr.matching) not in lhs_sigs]


def _result_labels(labels: Labels, expr: ast.BinaryExpr) -> Labels:
    if expr.op in ARITHMETIC or expr.return_bool:
        labels = drop_name(labels)
    if expr.matching.on:
        return tuple(p for p in labels if p[0] in expr.matching.labels)
    return tuple(p for p in labels if p[0] not in expr.matching.labels)


def vector_vector(expr: ast.BinaryExpr, lhs: Vector, rhs: Vector) -> Vector:
    """One-to-one matching: each signature at most once per side (else an error, as in
    Prometheus: 'many-to-many matching not allowed')."""
    by_sig: dict[Labels, Sample] = {}
    for s in rhs:
        sig = signature(s.labels, expr.matching)
        if sig in by_sig:
            raise AlertRuleError(f"many-to-many matching on the right side of {expr.op}: {sig}")
        by_sig[sig] = s
    seen: set[Labels] = set()
    out: Vector = []
    for s in lhs:
        sig = signature(s.labels, expr.matching)
        other = by_sig.get(sig)
        if other is None:
            continue
        if sig in seen:
            raise AlertRuleError(f"multiple matches on the left side of {expr.op}: {sig}")
        seen.add(sig)
        value, keep = _element(expr.op, s.value, other.value, expr.return_bool)
        if keep:
            out.append(Sample(_result_labels(s.labels, expr), value))
    return out


def apply(expr: ast.BinaryExpr, lhs: Value, rhs: Value) -> Value:
    if isinstance(lhs, float) and isinstance(rhs, float):
        return scalar_op(expr.op, lhs, rhs)
    if isinstance(lhs, list) and isinstance(rhs, float):
        return vector_scalar(expr, lhs, rhs, swap=False)
    if isinstance(lhs, float) and isinstance(rhs, list):
        return vector_scalar(expr, rhs, lhs, swap=True)
    assert isinstance(lhs, list) and isinstance(rhs, list)
    if expr.op in ast.SET_OPS:
        return set_op(expr, lhs, rhs)
    return vector_vector(expr, lhs, rhs)
