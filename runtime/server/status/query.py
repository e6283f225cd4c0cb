"""`/api/v1/query` and `/api/v1/query_range` over the embedded evaluator's sample store, answered
in Prometheus' HTTP API shape, so a panel (the status page's, or Grafana's Prometheus datasource)
reads the runtime itself or a real Prometheus alike:

    {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {...},
                                    "values": [[1718000000, "0.25"], ...]}]}}
    {"status": "error", "errorType": "bad_data", "error": "..."}        (400; 422 "execution")

Expressions are evaluated with every range and offset multiplied by `alerts_time_scale`, exactly
as the rules are (1.0 outside tests and demos: plain Prometheus semantics).

Every query runs under a `QueryBudget` (a deadline and a number of samples; see
runtime.server.status.query_runner for the thread it runs in and the response-size bound).
Times must be finite and between year 1 and 9999, parameters short; a refusal is a 400 naming
what was wrong.
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
from alerts.promql.budget import QueryBudget, QueryTimeoutError, unlimited
from alerts.promql.range import evaluate_range, step_times
from alerts.promql.types import Vector
from alerts.store import SampleStore

MAX_QUERY_CHARS = 8192
MAX_PARAM_CHARS = 64  # a time or a step: "2026-01-01T00:00:00.000000+00:00" is 32
# Unix seconds Python's datetime (and so the SQL store) can hold: years 1 to 9999
MIN_TIME_S, MAX_TIME_S = -62135596800.0, 253402300799.0
# Per-step results kept across queries, so that a panel refreshing every few seconds evaluates
# only its newest steps. Bounded in samples (measured with tracemalloc: ~175 bytes per memoized
# sample with its labels, so ~17 MB), least recently used first out; a query whose results alone
# exceed it keeps none.
MAX_MEMO_SAMPLES = 100_000
MAX_MEMOS = 128  # and in queries (a key is a parsed expression): the page asks ~60
MAX_STEPS_KEPT = 2048  # and in steps per query
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
    _check_length(text, name)
    if _NUMBER.match(text):
        value = float(text)
    else:
        try:
            value = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except (ValueError, OverflowError):
            message = f'invalid parameter "{name}": cannot parse {text!r} to a valid timestamp'
            raise QueryError(message) from None
    if not MIN_TIME_S <= value <= MAX_TIME_S:  # also NaN and the overflow to inf of 1e309
        raise QueryError(
            f'invalid parameter "{name}": {text!r} is outside years 1 to 9999 '
            f"({MIN_TIME_S:.0f} to {MAX_TIME_S:.0f} unix seconds)"
        )
    return value


def parse_step(text: str | None) -> float:
    if text is None or text == "":
        raise QueryError('missing parameter "step"')
    _check_length(text, "step")
    try:
        step = float(text) if _NUMBER.match(text) else parse_duration(text)
    except AlertRuleError:
        message = f'invalid parameter "step": cannot parse {text!r} to a valid duration'
        raise QueryError(message) from None
    if not 0 < step < math.inf:
        message = "zero, negative or infinite query resolution step widths are not accepted"
        raise QueryError(message)
    return step


def _check_length(text: str, name: str) -> None:
    if len(text) > MAX_PARAM_CHARS:
        raise QueryError(f'invalid parameter "{name}": longer than {MAX_PARAM_CHARS} characters')


class QueryService:
    """Queries over one store. Panels ask the same queries every refresh: each query's results
    per step are memoized once the store has a later round (`settled()`, the evaluator's newest
    round), so a refresh evaluates only the newest steps. Memos are keyed by the parsed
    expression (whitespace and spelling do not make a new one) and bounded in samples."""

    def __init__(
        self,
        store: SampleStore,
        lookback_s: float,
        time_scale: float,
        settled: Callable[[], float | None] = lambda: None,
        max_memo_samples: int = MAX_MEMO_SAMPLES,
    ) -> None:
        self.store = store
        self.lookback_s = lookback_s  # the instant-selector lookback, scaled like the rules
        self.time_scale = time_scale
        self.settled = settled
        self.max_memo_samples = max_memo_samples
        self._memos: OrderedDict[Any, dict[float, Vector]] = OrderedDict()
        self._lock = threading.Lock()

    def _parse(self, text: str | None) -> tuple[Any, str]:
        if not text:
            raise QueryError('missing parameter "query"')
        if len(text) > MAX_QUERY_CHARS:
            raise QueryError(f"query longer than {MAX_QUERY_CHARS} characters (max_query_chars)")
        try:
            expr = parse(text)
            kind = type_of(expr)
        except AlertRuleError as exc:  # a syntax error, or PromQL the subset does not have
            raise QueryError(f"parse error: {exc.message}") from exc
        if kind not in ("scalar", "vector"):
            raise QueryError(f'invalid expression type "{kind}": must be scalar or instant vector')
        return scale_durations(expr, self.time_scale), kind

    def memo_samples(self) -> int:
        with self._lock:
            return sum(_samples(memo) for memo in self._memos.values())

    def _take_memo(self, key: Any) -> dict[float, Vector]:
        """The memo of `key`, taken out while its query runs (a concurrent one of the same
        expression starts afresh), so it is never shared between threads."""
        with self._lock:
            return self._memos.pop(key, None) or {}

    def _keep_memo(self, key: Any, memo: dict[float, Vector]) -> None:
        size = _samples(memo)
        if not size or size > self.max_memo_samples:
            return
        with self._lock:
            self._memos[key] = memo
            total = sum(_samples(m) for m in self._memos.values())
            while total > self.max_memo_samples or len(self._memos) > MAX_MEMOS:
                _, evicted = self._memos.popitem(last=False)
                total -= _samples(evicted)

    def _settled(self) -> float:
        ts = self.settled()
        return -math.inf if ts is None else ts

    def instant(
        self, text: str | None, t: float, budget: QueryBudget | None = None
    ) -> dict[str, Any]:
        expr, kind = self._parse(text)
        t = round(t, 3)  # milliseconds, as Prometheus stamps results
        rows = self._range(expr, t, t, 1.0, budget)  # one step: the same path, the same memo
        if kind == "scalar":
            value = rows[0].points[0][1] if rows else math.nan
            return {"resultType": "scalar", "result": [t, format_value(value)]}
        result = [
            {"metric": dict(s.labels), "value": [t, format_value(s.points[0][1])]} for s in rows
        ]
        return {"resultType": "vector", "result": result}

    def range(
        self,
        text: str | None,
        start: float,
        end: float,
        step: float,
        budget: QueryBudget | None = None,
    ) -> dict[str, Any]:
        expr, _ = self._parse(text)
        try:
            step_times(start, end, step)
        except AlertRuleError as exc:
            raise QueryError(exc.message) from exc
        rows = self._range(expr, start, end, step, budget)
        return {"resultType": "matrix", "result": [_matrix_row(s) for s in rows]}

    def _range(
        self, expr: Any, start: float, end: float, step: float, budget: QueryBudget | None
    ) -> list[Series]:
        memo = self._take_memo(expr)
        try:
            rows = evaluate_range(
                self.store,
                expr,
                start,
                end,
                step,
                lookback_s=self.lookback_s,
                memo=memo,
                settled_before=self._settled(),
                budget=budget or unlimited(),
            )
        except QueryTimeoutError as exc:
            raise QueryError(exc.message, "timeout", 503) from exc
        except AlertRuleError as exc:  # too many samples, or an error in the data
            raise QueryError(exc.message, "execution", 422) from exc
        self._keep_memo(expr, _newest(memo))
        return rows


def _samples(memo: dict[float, Vector]) -> int:
    return sum(len(v) for v in memo.values()) + len(memo)  # an empty step still costs a slot


def _newest(memo: dict[float, Vector]) -> dict[float, Vector]:
    """Steps are inserted in time order: past this many, keep only the newest (a panel's
    window slides forward; older steps are not asked for again)."""
    if len(memo) <= MAX_STEPS_KEPT:
        return memo
    return dict(list(memo.items())[-MAX_STEPS_KEPT:])


def _matrix_row(series: Series) -> dict[str, Any]:
    values = [[t, format_value(v)] for t, v in series.points if v is not None]
    return {"metric": dict(series.labels), "values": values}
