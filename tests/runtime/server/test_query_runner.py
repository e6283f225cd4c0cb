"""The query runner's bounds without a server: samples, response bytes, concurrency and the
memo, over a MemorySampleStore filled here."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from alerts.promql import make_labels
from alerts.store import MemorySampleStore
from runtime.server.status.query import QueryService
from runtime.server.status.query_runner import QueryLimits, QueryRunner

END = 1_800_000_000.0
NUM_SERIES, NUM_POINTS = 20, 200


@pytest.fixture
def queries() -> QueryService:
    store = MemorySampleStore()
    series = [make_labels({"__name__": "m", "i": str(i)}) for i in range(NUM_SERIES)]
    for n in range(NUM_POINTS):
        store.append(END - (NUM_POINTS - n) * 15.0, [(s, float(n)) for s in series])
    return QueryService(store, 300.0, 1.0, settled=lambda: END + 1, max_memo_samples=5000)


def _answer(runner: QueryRunner, work: Any) -> tuple[int, dict[str, Any]]:
    async def run() -> tuple[int, bytes]:
        try:
            return await runner.answer(work)
        finally:
            runner.close()

    status, body = asyncio.run(run())
    return status, json.loads(body)


def _range(queries: QueryService, text: str = "m") -> Any:
    return lambda budget: queries.range(text, END - NUM_POINTS * 15.0, END, 15.0, budget)


def test_a_query_touching_too_many_samples_is_a_422(queries: QueryService) -> None:
    runner = QueryRunner(QueryLimits(max_samples=NUM_SERIES * NUM_POINTS // 2))
    status, body = _answer(runner, _range(queries))
    assert status == 422 and body["errorType"] == "execution"
    assert "query_max_samples" in body["error"]


def test_an_answer_over_the_byte_bound_is_a_422(queries: QueryService) -> None:
    status, body = _answer(QueryRunner(QueryLimits()), _range(queries))
    assert status == 200 and len(body["data"]["result"]) == NUM_SERIES
    status, body = _answer(QueryRunner(QueryLimits(max_response_bytes=10_000)), _range(queries))
    assert status == 422 and "query_max_response_bytes" in body["error"]


def test_past_max_concurrency_and_the_queue_a_query_is_a_503(queries: QueryService) -> None:
    release = threading.Event()
    runner = QueryRunner(QueryLimits(max_concurrency=1, max_queued=0))

    def blocked(_budget: Any) -> dict[str, Any]:
        release.wait(30)
        return {"resultType": "vector", "result": []}

    async def run() -> list[tuple[int, bytes]]:
        first = asyncio.ensure_future(runner.answer(blocked))
        await asyncio.sleep(0.05)  # the first one holds the only slot
        second = await runner.answer(blocked)
        release.set()
        return [await first, second]

    try:
        (status1, _), (status2, body2) = asyncio.run(run())
    finally:
        runner.close()
    assert status1 == 200 and status2 == 503
    assert "query_max_concurrency" in json.loads(body2)["error"]


def test_past_max_concurrency_a_query_waits_for_a_slot(queries: QueryService) -> None:
    """The status page sends dozens of panel queries at once: they queue, as Prometheus' do."""
    release = threading.Event()
    runner = QueryRunner(QueryLimits(max_concurrency=1, max_queued=4))
    order: list[int] = []

    def blocked(_budget: Any) -> dict[str, Any]:
        release.wait(30)
        order.append(0)
        return {"resultType": "vector", "result": []}

    def quick(_budget: Any) -> dict[str, Any]:
        order.append(1)
        return {"resultType": "vector", "result": []}

    async def run() -> list[tuple[int, bytes]]:
        first = asyncio.ensure_future(runner.answer(blocked))
        await asyncio.sleep(0.05)  # the first one holds the only slot
        waiting = [asyncio.ensure_future(runner.answer(quick)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert order == []  # they wait while the slot is held
        release.set()
        return [await first, *[await w for w in waiting]]

    try:
        answers = asyncio.run(run())
    finally:
        runner.close()
    assert [status for status, _ in answers] == [200] * 4
    assert order == [0, 1, 1, 1]


def test_a_query_waiting_past_its_deadline_is_a_503(queries: QueryService) -> None:
    release = threading.Event()
    runner = QueryRunner(QueryLimits(max_concurrency=1, timeout_s=0.2))

    def blocked(_budget: Any) -> dict[str, Any]:
        release.wait(30)
        return {"resultType": "vector", "result": []}

    async def run() -> tuple[int, bytes]:
        first = asyncio.ensure_future(runner.answer(blocked))
        await asyncio.sleep(0.05)
        second = await runner.answer(blocked)  # never gets the slot within 0.2 s
        release.set()
        await first
        return second

    try:
        status, body = asyncio.run(run())
    finally:
        runner.close()
    assert status == 503 and "no query slot free" in json.loads(body)["error"]


def test_an_unexpected_error_is_a_422_not_a_500(queries: QueryService) -> None:
    def broken(_budget: Any) -> dict[str, Any]:
        raise RecursionError("a bug")

    status, body = _answer(QueryRunner(QueryLimits()), broken)
    assert status == 422 and body == {
        "status": "error",
        "errorType": "execution",
        "error": "evaluation failed: RecursionError",
    }


def test_memos_are_keyed_by_expression_and_bounded_in_samples(queries: QueryService) -> None:
    queries.range("m * 1", END - 100 * 15.0, END, 15.0)
    kept = queries.memo_samples()
    assert 0 < kept <= queries.max_memo_samples
    queries.range("m  *   1", END - 100 * 15.0, END, 15.0)  # the same expression
    assert queries.memo_samples() == kept
    for n in range(10):  # different expressions, each of ~2,000 samples
        queries.range(f"m * {n + 2}", END - 100 * 15.0, END, 15.0)
        assert queries.memo_samples() <= queries.max_memo_samples
    queries.range("m * 1", END - NUM_POINTS * 15.0, END, 15.0)  # alone over the bound: not kept
    assert queries.memo_samples() <= queries.max_memo_samples
