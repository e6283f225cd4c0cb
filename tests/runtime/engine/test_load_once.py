"""The call-once contract on its own (the engine-level test is in test_engine_load.py)."""

from __future__ import annotations

import threading
import time

import pytest

from runtime.engine.load_once import CallOnce
from runtime.errors import ModelLoadError


def run_threads(n: int, target) -> list[object]:  # type: ignore[no-untyped-def]
    results: list[object] = [None] * n
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = target()
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_many_threads_one_call() -> None:
    calls = []

    def fn() -> str:
        calls.append(1)
        time.sleep(0.05)  # keep the load open while the others arrive
        return "model"

    once = CallOnce(fn)
    assert run_threads(100, once.get) == ["model"] * 100
    assert len(calls) == 1 and once.num_calls == 1 and once.is_done


def test_failure_reaches_every_waiter_and_a_later_call_retries() -> None:
    attempts = []

    def fn() -> str:
        attempts.append(1)
        time.sleep(0.05)
        if len(attempts) == 1:
            raise OSError("disk on fire")
        return "model"

    once = CallOnce(fn)
    results = run_threads(50, once.get)
    errors = [r for r in results if isinstance(r, ModelLoadError)]
    # everybody who joined the failed attempt got a distinct error naming the cause; anyone who
    # arrived after it failed started the (successful) retry
    assert errors and len({id(e) for e in errors}) == len(errors)
    assert all(isinstance(e.__cause__, OSError) and "disk on fire" in str(e) for e in errors)
    assert all(r == "model" for r in results if not isinstance(r, ModelLoadError))
    assert len(attempts) <= 2
    assert once.get() == "model" and len(attempts) == 2


def test_model_load_error_keeps_its_type_and_message() -> None:
    class Unsafe(ModelLoadError):
        pass

    def fn() -> str:
        raise Unsafe("pickle refused")

    with pytest.raises(Unsafe, match="pickle refused"):
        CallOnce(fn).get()
