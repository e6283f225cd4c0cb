"""Where the status page's PromQL queries run: off the event loop, in a few threads of their own,
each under a `QueryBudget` (alerts.promql.budget), its answer serialized and size-checked there
too, so that no query can hold the loop, the server's other worker threads, or unbounded memory.

    runner = QueryRunner(QueryLimits.from_settings(settings))
    status, body = await runner.answer(lambda budget: queries.range(q, a, b, step, budget))

Answers follow Prometheus' HTTP API: a query past its deadline is 503 `timeout` (its
`query.timeout`), one touching too many samples or answering too many bytes 422 `execution`
(its `query.max-samples`). At most `query_max_concurrency` queries run at once; more wait for a
slot in arrival order, as Prometheus' `query.max-concurrency` queues them (the status page sends a
few dozen panels' queries together), up to `max_queued` waiting and `query_timeout_s` of waiting:
past either, 503 `unavailable`.
Anything else a query raises is logged and answered 422 `execution`: no input makes a 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from alerts.promql.budget import QueryBudget
from runtime.server.status.query import QueryError

log = logging.getLogger("fastllm.server")

# the route waits this much past the deadline for the worker's own (budget) answer
_ANSWER_GRACE_S = 1.0

Answer = tuple[int, bytes]  # HTTP status, JSON body


@dataclass(frozen=True)
class QueryLimits:
    timeout_s: float = 10.0  # query_timeout_s
    max_samples: int = 500_000  # query_max_samples: store reads plus step results
    max_response_bytes: int = 16 << 20  # query_max_response_bytes
    max_concurrency: int = 4  # query_max_concurrency: queries evaluated at once
    max_queued: int = 64  # queries waiting for a slot at most (beyond: 503 at once)

    @classmethod
    def from_settings(cls, settings: Any) -> QueryLimits:
        return cls(
            settings.query_timeout_s,
            settings.query_max_samples,
            settings.query_max_response_bytes,
            settings.query_max_concurrency,
        )


class QueryRunner:
    def __init__(self, limits: QueryLimits) -> None:
        self.limits = limits
        self._executor = ThreadPoolExecutor(limits.max_concurrency, "status-query")
        self._num_running = 0  # touched only on the event loop
        self._num_waiting = 0  # likewise
        self._slots: asyncio.Semaphore | None = None  # made on the loop that first asks
        self._budgets: set[QueryBudget] = set()
        self._budgets_lock = threading.Lock()
        self._closed = threading.Event()

    async def answer(self, work: Callable[[QueryBudget], dict[str, Any]]) -> Answer:
        if self._closed.is_set():
            return _error(QueryError("the server is stopping", "unavailable", 503))
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limits.max_concurrency)
        slots = self._slots
        if slots.locked() and self._num_waiting >= self.limits.max_queued:
            message = (
                f"too many queries in flight (query_max_concurrency={self.limits.max_concurrency}"
                f", {self._num_waiting} waiting)"
            )
            return _error(QueryError(message, "unavailable", 503))
        self._num_waiting += 1
        try:
            await asyncio.wait_for(slots.acquire(), self.limits.timeout_s)
        except TimeoutError:
            message = (
                f"no query slot free in query_timeout_s={self.limits.timeout_s:g} "
                f"(query_max_concurrency={self.limits.max_concurrency})"
            )
            return _error(QueryError(message, "unavailable", 503))
        finally:
            self._num_waiting -= 1
        budget = QueryBudget.start(
            timeout_s=self.limits.timeout_s, max_samples=self.limits.max_samples
        )
        self._num_running += 1
        future = asyncio.get_running_loop().run_in_executor(self._executor, self._run, work, budget)
        future.add_done_callback(lambda _: self._release(slots))
        try:
            return await asyncio.wait_for(
                asyncio.shield(future), self.limits.timeout_s + _ANSWER_GRACE_S
            )
        except TimeoutError:
            # a store read the budget could not interrupt: answer now; the worker stops at
            # its next check and only then frees its slot
            budget.cancelled.set()
            message = f"query timed out (query_timeout_s={self.limits.timeout_s:g})"
            return _error(QueryError(message, "timeout", 503))

    def _release(self, slots: asyncio.Semaphore) -> None:
        """The worker is done (on the loop): its slot goes to the longest waiting query."""
        self._num_running -= 1
        slots.release()

    def _run(self, work: Callable[[QueryBudget], dict[str, Any]], budget: QueryBudget) -> Answer:
        with self._budgets_lock:
            self._budgets.add(budget)
        if self._closed.is_set():
            budget.cancelled.set()
        try:
            data = work(budget)
            body = _dumps({"status": "success", "data": data})
        except QueryError as exc:
            return _error(exc)
        except Exception as exc:  # a bug, not the input's fault: logged, but never a 500
            log.exception("status query failed")
            return _error(QueryError(f"evaluation failed: {type(exc).__name__}", "execution", 422))
        finally:
            with self._budgets_lock:
                self._budgets.discard(budget)
        if len(body) > self.limits.max_response_bytes:
            message = (
                f"response of {len(body)} bytes exceeds query_max_response_bytes="
                f"{self.limits.max_response_bytes}; narrow the query or raise the step"
            )
            return _error(QueryError(message, "execution", 422))
        return 200, body

    def close(self) -> None:
        """Stop every running query at its next check; later ones are refused (503)."""
        self._closed.set()
        with self._budgets_lock:
            for budget in self._budgets:
                budget.cancelled.set()
        self._executor.shutdown(wait=False, cancel_futures=True)


def _dumps(content: Any) -> bytes:
    # values are already Prometheus strings ("NaN", "+Inf"), times finite: a NaN here is a bug
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _error(exc: QueryError) -> Answer:
    return exc.status, _dumps(exc.payload())
