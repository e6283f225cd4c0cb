"""What one query may spend: a deadline and a number of samples, as Prometheus' `query.timeout`
and `query.max-samples`. Python cannot stop a thread from outside, so the evaluator checks the
budget itself between steps and at every store read; a query over budget raises, frees what it
built, and its caller answers 503 (timeout) or 422 (too many samples).

    budget = QueryBudget.start(timeout_s=10.0, max_samples=500_000)
    evaluate_range(store, expr, start, end, step, lookback_s=300.0, budget=budget)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from alerts.errors import AlertRuleError


class QueryTimeoutError(AlertRuleError):
    """The query ran past its deadline (or the server is stopping)."""


class TooManySamplesError(AlertRuleError):
    """The query would touch more samples than it may."""


@dataclass(eq=False)  # compared and hashed by identity: a runner keeps a set of live ones
class QueryBudget:
    deadline: float  # time.monotonic() after which the query stops
    timeout_s: float  # for the message
    max_samples: int  # samples read from the store plus samples in step results
    num_samples: int = 0
    # set by the owner (a stopping server): the query stops at its next check
    cancelled: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(
        cls, *, timeout_s: float, max_samples: int, cancelled: threading.Event | None = None
    ) -> QueryBudget:
        return cls(
            time.monotonic() + timeout_s, timeout_s, max_samples, 0, cancelled or threading.Event()
        )

    def check(self) -> None:
        if self.cancelled.is_set():
            raise QueryTimeoutError("query cancelled: the server is stopping")
        if time.monotonic() > self.deadline:
            raise QueryTimeoutError(
                f"query timed out in expression evaluation (query_timeout_s={self.timeout_s:g})"
            )

    def spend(self, num_samples: int) -> None:
        self.num_samples += num_samples
        if self.num_samples > self.max_samples:
            raise TooManySamplesError(
                "query processing would load too many samples into memory in query execution "
                f"(query_max_samples={self.max_samples})"
            )
        self.check()


def unlimited() -> QueryBudget:
    """The rules' budget: their evaluation is the server's own, bounded by the rule files."""
    return QueryBudget(float("inf"), float("inf"), 1 << 62)
