"""`/api/v1/query` and `/api/v1/query_range` over the embedded evaluator's sample store, answered
in Prometheus' HTTP API shape, so a panel (the status page's, or Grafana's Prometheus datasource)
reads the runtime itself or a real Prometheus alike:

    {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {...},
                                    "values": [[1718000000, "0.25"], ...]}]}}
    {"status": "error", "errorType": "bad_data", "error": "..."}        (400; 422 "execution")

Expressions are evaluated with every range and offset multiplied by `alerts_time_scale`, exactly
as the rules are (1.0 outside tests and demos: plain Prometheus semantics).
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any

from alerts.errors import AlertRuleError
from alerts.promql import Series, parse, parse_duration, scale_durations, type_of
from alerts.promql.range import evaluate_range, step_times
from alerts.promql.types import Vector
from alerts.store import SampleStore

MAX_QUERY_CHARS = 8192
MAX_MEMOS = 512  # queries whose per-step results are kept (the page asks ~60)
MAX_STEPS_KEPT = 2048
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


class QueryError(Exception):
    """A refused query: `error_type` as Prometheus names it, and the HTTP status it maps to."""

    def __init__(self, message: str, error_type: str = "bad_data", status: int = 400) -> None:
        super().__init__(message)
        self.message, self.error_type, self.status = message, error_type, status

    def payload(self) -> dict[str, Any]:
        return {"status": "error", "errorType": self.error_type, "error": self.message}


def format_value(value: float | None) -> str:
    """As Prometheus writes sample values (Go's FormatFloat 'f', -1): no exponent, NaN, +Inf."""
    if value is None or math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return format(Decimal(repr(value)), "f")


def parse_time(text: str | None, name: str, default: float | None = None) -> float:
    """Unix seconds (float) or RFC 3339, the two forms Prometheus accepts."""
    if text is None or text == "":
        if default is None:
            raise QueryError(f'missing parameter "{name}"')
        return default
    if _NUMBER.match(text):
        return float(text)
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        message = f'invalid parameter "{name}": cannot parse {text!r} to a valid timestamp'
        raise QueryError(message) from None


def parse_step(text: str | None) -> float:
    if text is None or text == "":
        raise QueryError('missing parameter "step"')
    try:
        return float(text) if _NUMBER.match(text) else parse_duration(text)
    except AlertRuleError:
        message = f'invalid parameter "step": cannot parse {text!r} to a valid duration'
        raise QueryError(message) from None


class QueryService:
    """Queries over one store. Panels ask the same queries every refresh: each query's results
    per step are memoized once the store has a later round (`settled()`, the evaluator's newest
    round), so a refresh evaluates only the newest steps."""

    def __init__(
        self,
        store: SampleStore,
        lookback_s: float,
        time_scale: float,
        settled: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.store = store
        self.lookback_s = lookback_s  # the instant-selector lookback, scaled like the rules
        self.time_scale = time_scale
        self.settled = settled
        self._memos: OrderedDict[str, dict[float, Vector]] = OrderedDict()
        self._lock = threading.Lock()

    def _parse(self, text: str | None) -> tuple[Any, str]:
        if not text:
            raise QueryError('missing parameter "query"')
        if len(text) > MAX_QUERY_CHARS:
            raise QueryError(f"query longer than {MAX_QUERY_CHARS} characters")
        try:
            expr = parse(text)
            kind = type_of(expr)
        except AlertRuleError as exc:  # a syntax error, or PromQL the subset does not have
            raise QueryError(f"parse error: {exc.message}") from exc
        if kind not in ("scalar", "vector"):
            raise QueryError(f'invalid expression type "{kind}": must be scalar or instant vector')
        return scale_durations(expr, self.time_scale), kind

    def _memo(self, text: str) -> dict[float, Vector]:
        with self._lock:
            memo = self._memos.pop(text, None)
            if memo is None:
                memo = {}
            elif len(memo) > 4 * MAX_STEPS_KEPT:
                # oldest steps first (inserted in time order): keep the newest
                memo = dict(list(memo.items())[-MAX_STEPS_KEPT:])
            self._memos[text] = memo
            while len(self._memos) > MAX_MEMOS:
                self._memos.popitem(last=False)
            return memo

    def _settled(self) -> float:
        ts = self.settled()
        return -math.inf if ts is None else ts

    def instant(self, text: str | None, t: float) -> dict[str, Any]:
        expr, kind = self._parse(text)
        t = round(t, 3)  # milliseconds, as Prometheus stamps results
        rows = self._range(text, expr, t, t, 1.0)  # one step: the same path, the same memo
        if kind == "scalar":
            value = rows[0].points[0][1] if rows else math.nan
            return {"resultType": "scalar", "result": [t, format_value(value)]}
        result = [
            {"metric": dict(s.labels), "value": [t, format_value(s.points[0][1])]} for s in rows
        ]
        return {"resultType": "vector", "result": result}

    def range(self, text: str | None, start: float, end: float, step: float) -> dict[str, Any]:
        expr, _ = self._parse(text)
        try:
            step_times(start, end, step)
        except AlertRuleError as exc:
            raise QueryError(exc.message) from exc
        rows = self._range(text, expr, start, end, step)
        return {"resultType": "matrix", "result": [_matrix_row(s) for s in rows]}

    def _range(self, text: Any, expr: Any, start: float, end: float, step: float) -> list[Series]:
        try:
            return evaluate_range(
                self.store,
                expr,
                start,
                end,
                step,
                lookback_s=self.lookback_s,
                memo=self._memo(str(text)),
                settled_before=self._settled(),
            )
        except AlertRuleError as exc:
            raise QueryError(exc.message, "execution", 422) from exc


def _matrix_row(series: Series) -> dict[str, Any]:
    values = [[t, format_value(v)] for t, v in series.points if v is not None]
    return {"metric": dict(series.labels), "values": values}
