"""Tree walks over a parsed expression: scaling its time windows, listing the metrics it reads."""

from __future__ import annotations

from dataclasses import replace

from alerts.promql import ast


def scale_durations(expr: ast.Expr, factor: float) -> ast.Expr:
    """The same expression with every range [d], offset and predict_linear horizon multiplied
    by `factor` (the `alerts_time_scale` setting: end-to-end tests shorten a 30m window to
    seconds). Rates come out per (real) second, so a rule comparing a raw rate with a constant
    would change meaning; ours compare ratios, increases and predictions, which do not."""
    if factor == 1.0:
        return expr
    if isinstance(expr, ast.VectorSelector):
        return replace(expr, offset_s=expr.offset_s * factor)
    if isinstance(expr, ast.MatrixSelector):
        selector = scale_durations(expr.selector, factor)
        assert isinstance(selector, ast.VectorSelector)
        return ast.MatrixSelector(selector, expr.range_s * factor)
    if isinstance(expr, ast.Call):
        args = [scale_durations(a, factor) for a in expr.args]
        if expr.func == "predict_linear":
            # its second argument is a horizon in seconds: scaled too, so the predicted value
            # (slope x horizon) and with it the alert timeline stay the same at any scale
            args[1] = ast.BinaryExpr("*", args[1], ast.NumberLiteral(factor))
        return replace(expr, args=tuple(args))
    if isinstance(expr, ast.Aggregation | ast.Unary):
        return replace(expr, expr=scale_durations(expr.expr, factor))
    if isinstance(expr, ast.BinaryExpr):
        return replace(
            expr, lhs=scale_durations(expr.lhs, factor), rhs=scale_durations(expr.rhs, factor)
        )
    return expr


def selectors(expr: ast.Expr) -> list[ast.VectorSelector]:
    if isinstance(expr, ast.VectorSelector):
        return [expr]
    if isinstance(expr, ast.MatrixSelector):
        return [expr.selector]
    if isinstance(expr, ast.Call):
        return [s for a in expr.args for s in selectors(a)]
    if isinstance(expr, ast.Aggregation | ast.Unary):
        return selectors(expr.expr)
    if isinstance(expr, ast.BinaryExpr):
        return selectors(expr.lhs) + selectors(expr.rhs)
    return []


def selected_names(expr: ast.Expr) -> set[str] | None:
    """Metric names the expression reads; None when some selector has no fixed name (then a
    sampler must keep every series)."""
    names: set[str] = set()
    for sel in selectors(expr):
        if sel.metric_name is None:
            return None
        names.add(sel.metric_name)
    return names


def max_window_s(expr: ast.Expr) -> float:
    """How far back the expression looks, beyond the instant lookback: max(range + offset)."""
    reach = 0.0
    for sel in selectors(expr):
        reach = max(reach, sel.offset_s)
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.MatrixSelector):
            reach = max(reach, node.range_s + node.selector.offset_s)
        elif isinstance(node, ast.Call):
            stack.extend(node.args)
        elif isinstance(node, ast.Aggregation | ast.Unary):
            stack.append(node.expr)
        elif isinstance(node, ast.BinaryExpr):
            stack.extend((node.lhs, node.rhs))
    return reach
