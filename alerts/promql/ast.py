"""Syntax tree of the PromQL subset. Durations are float seconds."""

from __future__ import annotations

from dataclasses import dataclass, field

from alerts.promql.types import Matcher


@dataclass(frozen=True)
class NumberLiteral:
    value: float


@dataclass(frozen=True)
class StringLiteral:
    value: str


@dataclass(frozen=True)
class VectorSelector:
    matchers: tuple[Matcher, ...]
    offset_s: float = 0.0

    @property
    def metric_name(self) -> str | None:
        for m in self.matchers:
            if m.name == "__name__" and m.op == "=":
                return m.value
        return None


@dataclass(frozen=True)
class MatrixSelector:
    selector: VectorSelector
    range_s: float


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Aggregation:
    op: str  # sum | avg | min | max | count
    expr: Expr
    grouping: tuple[str, ...] = ()
    without: bool = False


@dataclass(frozen=True)
class VectorMatching:
    on: bool = False  # True: match on `labels` only; False: ignoring `labels`
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class BinaryExpr:
    op: str
    lhs: Expr
    rhs: Expr
    matching: VectorMatching = field(default_factory=VectorMatching)
    return_bool: bool = False


@dataclass(frozen=True)
class Unary:
    op: str  # "-" | "+"
    expr: Expr


Expr = (
    NumberLiteral
    | StringLiteral
    | VectorSelector
    | MatrixSelector
    | Call
    | Aggregation
    | BinaryExpr
    | Unary
)

COMPARISON_OPS = frozenset({"==", "!=", ">", "<", ">=", "<="})
SET_OPS = frozenset({"and", "or", "unless"})
ARITHMETIC_OPS = frozenset({"+", "-", "*", "/", "%", "^"})


def children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, Unary | Aggregation):
        return (expr.expr,)
    if isinstance(expr, BinaryExpr):
        return (expr.lhs, expr.rhs)
    if isinstance(expr, Call):
        return expr.args
    return ()


def depth(expr: Expr) -> int:
    """Levels of the tree, counted without recursion (a left-deep `1+1+...+1` is as deep as it
    is long, and every later pass over it recurses)."""
    deepest, todo = 0, [(expr, 1)]
    while todo:
        node, level = todo.pop()
        deepest = max(deepest, level)
        todo.extend((child, level + 1) for child in children(node))
    return deepest
