"""Call-once loading under a stampede: 200 threads call load() and submit() at the same time.
A hang is caught by the pytest timeout (the failure detector), never by a timing assertion."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from runtime.engine.engine import Engine
from runtime.engine.request import TokenOutput
from runtime.errors import ModelLoadError
from runtime.memory import Allocator
from runtime.models.loader import LoadedModel, load_model
from tests.runtime.engine.support import (
    engine_config,
    greedy,
    live_owners,
    one_torch_thread,
    request,
)

NUM_THREADS = 200

pytestmark = pytest.mark.usefixtures(one_torch_thread.__name__)


class CountingLoader:
    def __init__(self, model_dir: Path, failures: int = 0) -> None:
        self.model_dir = model_dir
        self.failures = failures
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self) -> LoadedModel:
        with self.lock:
            self.calls += 1
            fail = self.calls <= self.failures
        time.sleep(0.2)  # keep the load open while the other threads pile up behind it
        if fail:
            raise OSError(f"simulated disk error on attempt {self.calls}")
        return load_model(self.model_dir, device="cpu")


def stampede(engine: Engine, num_threads: int) -> list[object]:
    results: list[object] = [None] * num_threads
    barrier = threading.Barrier(num_threads)

    def worker(i: int) -> None:
        barrier.wait()
        try:
            if i % 2 == 0:
                engine.load()
                results[i] = "loaded"
            else:
                prompt = [5 + i % 50, 7, 9 + i % 7]
                handle = engine.submit(request(f"r{i}", prompt, greedy(3)))
                results[i] = handle.result(timeout=120)
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(num_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.timeout(180)
def test_200_threads_load_and_submit_concurrently_load_once(demo_model_dir) -> None:
    loader = CountingLoader(demo_model_dir("llama"))
    engine = Engine(
        engine_config(max_queued_requests=NUM_THREADS),
        loader=loader,
        allocator=Allocator(device="cpu"),
    )
    try:
        results = stampede(engine, NUM_THREADS)
        assert loader.calls == 1
        assert results[0::2] == ["loaded"] * (NUM_THREADS // 2)
        completions = results[1::2]
        errors = [r for r in completions if isinstance(r, Exception)]
        assert errors == []
        outputs = [r for r in completions if isinstance(r, TokenOutput)]
        assert len(outputs) == NUM_THREADS // 2
        assert all(r.completion_tokens == 3 and r.finished_reason == "length" for r in outputs)
    finally:
        engine.shutdown(drain_timeout_s=5)
    assert live_owners(engine) == []  # every finished sequence gave its KV back


@pytest.mark.timeout(180)
def test_failed_load_reaches_every_waiter_then_a_retry_loads(demo_model_dir) -> None:
    loader = CountingLoader(demo_model_dir("llama"), failures=1)
    engine = Engine(
        engine_config(max_queued_requests=NUM_THREADS),
        loader=loader,
        allocator=Allocator(device="cpu"),
    )
    try:
        results = stampede(engine, 64)
        errors = [r for r in results if isinstance(r, ModelLoadError)]
        assert errors, "the failing first attempt must reach its waiters"
        assert all("simulated disk error on attempt 1" in str(e) for e in errors)
        assert all(isinstance(e.__cause__, OSError) for e in errors)
        # whoever arrived after the failure retried; the retry loaded and served them
        others = [r for r in results if not isinstance(r, ModelLoadError)]
        assert all(r == "loaded" or getattr(r, "completion_tokens", None) == 3 for r in others)
        assert loader.calls <= 2
        engine.load()
        assert engine.is_loaded and loader.calls == 2
        out = engine.submit(request("after", [5, 6, 7], greedy(2))).result(timeout=60)
        assert out.completion_tokens == 2
    finally:
        engine.shutdown(drain_timeout_s=5)
