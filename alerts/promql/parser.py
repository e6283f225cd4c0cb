"""Recursive-descent (Pratt) parser for the PromQL subset the rules use, with a static type check
so a rule outside the subset fails at load time (`fastllm alerts check`), not at 3 a.m.

Supported: selectors with =, !=, =~, !~ matchers, range [d] and `offset d`; functions in
`functions.SIGNATURES`; sum/avg/min/max/count with by/without; arithmetic and comparison
operators (with `bool`) between scalars and vectors; and/or/unless; on()/ignoring() matching.
Not supported (rejected with AlertRuleError): subqueries, group_left/group_right, @ modifiers,
topk/quantile-style parameterised aggregations.
"""

from __future__ import annotations

from alerts.errors import AlertRuleError
from alerts.promql import ast
from alerts.promql.functions import SIGNATURES
from alerts.promql.lexer import Token, parse_duration, tokenize
from alerts.promql.types import METRIC_NAME, Matcher

PRECEDENCE = {"or": 1, "and": 2, "unless": 2, "+": 4, "-": 4, "*": 5, "/": 5, "%": 5, "^": 6}
PRECEDENCE.update({op: 3 for op in ast.COMPARISON_OPS})
AGGREGATIONS = frozenset({"sum", "avg", "min", "max", "count"})
_KEYWORD_OPS = frozenset({"and", "or", "unless"})
# Nesting levels of a parsed expression (parentheses, unary signs, operands, call arguments):
# every pass over the tree (type check, evaluation) recurses, so a deeper one is refused by name
# instead of exhausting the interpreter's stack. The rules nest fewer than 15.
MAX_DEPTH = 100


def parse(source: str) -> ast.Expr:
    parser = _Parser(source)
    expr = parser.expr(0)
    parser.expect("eof")
    if ast.depth(expr) > MAX_DEPTH:
        raise _too_deep()
    type_of(expr)  # raises on type errors
    return expr


def _too_deep() -> AlertRuleError:
    return AlertRuleError(f"expression nested deeper than {MAX_DEPTH} levels (max_depth)")


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = tokenize(source)
        self.i = 0
        self.level = 0  # expr() calls in progress (the parser's own recursion)

    # --- token helpers ---------------------------------------------------------------------
    def peek(self, offset: int = 0) -> Token:
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def next(self) -> Token:
        tok = self.peek()
        self.i += 1
        return tok

    def error(self, message: str, tok: Token | None = None) -> AlertRuleError:
        tok = tok or self.peek()
        return AlertRuleError(f"{message} at position {tok.pos} in {self.source!r}")

    def expect(self, kind: str, text: str | None = None) -> Token:
        tok = self.next()
        if tok.kind != kind or (text is not None and tok.text != text):
            raise self.error(f"expected {text or kind}, found {tok.text or tok.kind!r}", tok)
        return tok

    def is_op(self, text: str, offset: int = 0) -> bool:
        tok = self.peek(offset)
        return tok.kind == "op" and tok.text == text

    def is_keyword(self, word: str) -> bool:
        tok = self.peek()
        return tok.kind == "ident" and tok.text.lower() == word

    # --- expressions -----------------------------------------------------------------------
    def binary_op(self) -> str | None:
        tok = self.peek()
        if tok.kind == "op" and tok.text in PRECEDENCE:
            return tok.text
        if tok.kind == "ident" and tok.text.lower() in _KEYWORD_OPS:
            return tok.text.lower()
        return None

    def expr(self, min_prec: int) -> ast.Expr:
        if self.level >= MAX_DEPTH:
            raise _too_deep()
        self.level += 1
        try:
            return self._expr(min_prec)
        finally:
            self.level -= 1

    def _expr(self, min_prec: int) -> ast.Expr:
        lhs = self.unary()
        while (op := self.binary_op()) is not None and PRECEDENCE[op] >= min_prec:
            self.next()
            return_bool = False
            if op in ast.COMPARISON_OPS and self.is_keyword("bool"):
                self.next()
                return_bool = True
            matching = ast.VectorMatching()
            if self.is_keyword("on") or self.is_keyword("ignoring"):
                on = self.next().text.lower() == "on"
                matching = ast.VectorMatching(on=on, labels=self.label_list())
            if self.is_keyword("group_left") or self.is_keyword("group_right"):
                raise self.error("group_left/group_right are not supported by the evaluator")
            # ^ is right-associative; everything else is left-associative
            rhs = self.expr(PRECEDENCE[op] if op == "^" else PRECEDENCE[op] + 1)
            lhs = ast.BinaryExpr(op, lhs, rhs, matching, return_bool)
        return lhs

    def unary(self) -> ast.Expr:
        if self.is_op("-") or self.is_op("+"):
            op = self.next().text
            operand = self.expr(PRECEDENCE["^"])
            if isinstance(operand, ast.NumberLiteral):
                return ast.NumberLiteral(-operand.value if op == "-" else operand.value)
            return ast.Unary(op, operand)
        return self.postfix(self.primary())

    def postfix(self, expr: ast.Expr) -> ast.Expr:
        if self.is_op("["):
            tok = self.next()
            if not isinstance(expr, ast.VectorSelector):
                raise self.error("a range [d] applies only to a metric selector", tok)
            range_s = parse_duration(self.expect("duration").text)
            if not self.is_op("]"):
                raise self.error("subqueries are not supported by the evaluator")
            self.next()
            expr = ast.MatrixSelector(expr, range_s)
        if self.is_keyword("offset"):
            tok = self.next()
            offset_s = parse_duration(self.expect("duration").text)
            if isinstance(expr, ast.VectorSelector):
                expr = ast.VectorSelector(expr.matchers, offset_s)
            elif isinstance(expr, ast.MatrixSelector):
                expr = ast.MatrixSelector(
                    ast.VectorSelector(expr.selector.matchers, offset_s), expr.range_s
                )
            else:
                raise self.error("offset applies only to a selector", tok)
        return expr

    def primary(self) -> ast.Expr:
        tok = self.peek()
        if tok.kind == "number":
            self.next()
            return ast.NumberLiteral(float(tok.text))
        if tok.kind == "string":
            self.next()
            return ast.StringLiteral(tok.text)
        if self.is_op("("):
            self.next()
            inner = self.expr(0)
            self.expect("op", ")")
            return inner
        if self.is_op("{"):
            return self.selector(self.matchers())
        if tok.kind != "ident":
            raise self.error(f"unexpected {tok.text or tok.kind!r}")
        word = tok.text
        if word.lower() in ("inf", "nan"):
            self.next()
            return ast.NumberLiteral(float(word))
        if word.lower() in AGGREGATIONS and (
            self.is_op("(", 1) or self.peek(1).text.lower() in ("by", "without")
        ):
            return self.aggregation()
        if self.is_op("(", 1):
            return self.call()
        self.next()
        name = Matcher.create(METRIC_NAME, "=", word)
        extra = self.matchers() if self.is_op("{") else ()
        return self.selector((name, *extra))

    def selector(self, matchers: tuple[Matcher, ...]) -> ast.VectorSelector:
        # as in Prometheus: some matcher must reject the empty label set, or it selects everything
        if all(m.matches(()) for m in matchers):
            raise self.error("a selector needs a matcher that does not match the empty value")
        return ast.VectorSelector(matchers)

    def matchers(self) -> tuple[Matcher, ...]:
        self.expect("op", "{")
        found: list[Matcher] = []
        while not self.is_op("}"):
            name = self.expect("ident").text
            op = self.next()
            if op.kind != "op" or op.text not in ("=", "!=", "=~", "!~"):
                raise self.error("expected a label matcher operator", op)
            found.append(Matcher.create(name, op.text, self.expect("string").text))
            if not self.is_op("}"):
                self.expect("op", ",")
        self.next()
        return tuple(found)

    def label_list(self) -> tuple[str, ...]:
        self.expect("op", "(")
        names: list[str] = []
        while not self.is_op(")"):
            names.append(self.expect("ident").text)
            if not self.is_op(")"):
                self.expect("op", ",")
        self.next()
        return tuple(names)

    def grouping(self) -> tuple[tuple[str, ...], bool] | None:
        if self.is_keyword("by") or self.is_keyword("without"):
            without = self.next().text.lower() == "without"
            return self.label_list(), without
        return None

    def aggregation(self) -> ast.Expr:
        op = self.next().text.lower()
        grouping = self.grouping()
        self.expect("op", "(")
        inner = self.expr(0)
        if self.is_op(","):
            raise self.error(f"parameterised aggregations are not supported ({op})")
        self.expect("op", ")")
        grouping = grouping or self.grouping() or ((), False)
        return ast.Aggregation(op, inner, grouping[0], grouping[1])

    def call(self) -> ast.Expr:
        tok = self.next()
        if tok.text not in SIGNATURES:
            raise self.error(f"function {tok.text!r} is not supported by the evaluator", tok)
        self.expect("op", "(")
        args: list[ast.Expr] = []
        while not self.is_op(")"):
            args.append(self.expr(0))
            if not self.is_op(")"):
                self.expect("op", ",")
        self.next()
        return ast.Call(tok.text, tuple(args))


def type_of(expr: ast.Expr) -> str:
    """'scalar' | 'vector' | 'matrix' | 'string'; raises AlertRuleError on a type error."""
    if isinstance(expr, ast.NumberLiteral):
        return "scalar"
    if isinstance(expr, ast.StringLiteral):
        return "string"
    if isinstance(expr, ast.VectorSelector):
        return "vector"
    if isinstance(expr, ast.MatrixSelector):
        return "matrix"
    if isinstance(expr, ast.Unary):
        return _expect(type_of(expr.expr), ("scalar", "vector"), "unary operand")
    if isinstance(expr, ast.Aggregation):
        _expect(type_of(expr.expr), ("vector",), f"{expr.op}() argument")
        return "vector"
    if isinstance(expr, ast.Call):
        arg_types, result = SIGNATURES[expr.func]
        if len(expr.args) != len(arg_types):
            raise AlertRuleError(f"{expr.func}() takes {len(arg_types)} argument(s)")
        for arg, wanted in zip(expr.args, arg_types, strict=True):
            _expect(type_of(arg), (wanted,), f"{expr.func}() argument")
        return result
    lhs = _expect(type_of(expr.lhs), ("scalar", "vector"), f"left operand of {expr.op}")
    rhs = _expect(type_of(expr.rhs), ("scalar", "vector"), f"right operand of {expr.op}")
    if expr.op in ast.SET_OPS and (lhs, rhs) != ("vector", "vector"):
        raise AlertRuleError(f"{expr.op} needs instant vectors on both sides")
    if expr.op in ast.COMPARISON_OPS and lhs == rhs == "scalar" and not expr.return_bool:
        raise AlertRuleError("comparisons between scalars must use bool")
    if (expr.matching.labels or expr.matching.on) and "scalar" in (lhs, rhs):
        raise AlertRuleError("on()/ignoring() need vectors on both sides")
    return "scalar" if lhs == rhs == "scalar" else "vector"


def _expect(found: str, allowed: tuple[str, ...], what: str) -> str:
    if found not in allowed:
        raise AlertRuleError(f"{what}: expected {' or '.join(allowed)}, got {found}")
    return found
