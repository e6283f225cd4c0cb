"""RequestHandle: the engine thread fills it; threads and asyncio tasks read it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from runtime.engine.request import RequestHandle, TokenOutput
from runtime.errors import RequestTimeout


def out(i: int, reason: str | None = None, error: Exception | None = None) -> TokenOutput:
    return TokenOutput("r", [i], f"t{i}", reason, 3, i + 1, error)  # type: ignore[arg-type]


def produce(handle: RequestHandle, n: int, final: TokenOutput) -> threading.Thread:
    def run() -> None:
        for i in range(n):
            handle.push(out(i))
        handle.push(final)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_blocking_iteration_sees_every_delta_then_stops() -> None:
    handle = RequestHandle("r")
    thread = produce(handle, 50, out(50, "length"))
    outputs = list(handle)
    thread.join()
    assert [o.token_ids[0] for o in outputs] == list(range(51))
    assert outputs[-1].finished_reason == "length"
    joined = handle.result(timeout=5)
    assert joined.token_ids == list(range(51)) and joined.text == "".join(
        f"t{i}" for i in range(51)
    )


def test_async_iteration_from_another_loop_thread() -> None:
    handle = RequestHandle("r")

    async def consume() -> list[TokenOutput]:
        thread = produce(handle, 200, out(200, "stop"))
        outputs = [o async for o in handle]
        thread.join()
        return outputs

    outputs = asyncio.run(consume())
    assert [o.token_ids[0] for o in outputs] == list(range(201))
    assert asyncio.run(handle.aresult()).completion_tokens == 201  # already finished: returns


def test_error_ends_the_stream_and_result_raises_it() -> None:
    handle = RequestHandle("r")
    error = RequestTimeout("too slow")
    thread = produce(handle, 2, TokenOutput("r", [], "", None, 3, 2, error))
    outputs = list(handle)
    thread.join()
    assert outputs[-1].error is error
    with pytest.raises(RequestTimeout):
        handle.result()
    handle.push(out(9, "stop"))  # pushes after the final output are ignored
    assert len(list(handle)) == 0


def test_result_with_timeout_raises_when_unfinished_and_cancel_calls_back() -> None:
    cancelled: list[str] = []

    def cancel(rid: str) -> bool:
        cancelled.append(rid)
        return True

    handle = RequestHandle("r", cancel)
    with pytest.raises(RequestTimeout):
        handle.result(timeout=0.01)
    assert handle.cancel() and cancelled == ["r"]


def test_batches_drain_what_is_there_and_lose_nothing() -> None:
    handle = RequestHandle("r")
    for i in range(3):  # already there before the consumer runs: one batch
        handle.push(out(i))
    thread = produce(handle, 0, out(3))
    thread.join()  # one more, pushed from another thread

    async def consume() -> list[list[TokenOutput]]:
        batches: list[list[TokenOutput]] = []
        async for batch in handle.batches():
            batches.append(batch)
            if len(batches) == 1:  # the rest arrives from another thread while we wait
                threads.append(produce(handle, 0, out(4, "stop")))
        return batches

    threads: list[threading.Thread] = []
    batches = asyncio.run(consume())
    threads[0].join()
    assert [[o.token_ids[0] for o in batch] for batch in batches] == [[0, 1, 2, 3], [4]]
    assert batches[-1][-1].finished_reason == "stop"
