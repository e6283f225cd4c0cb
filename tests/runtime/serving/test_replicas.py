"""ReplicaSet: several tiny-llama engines behind one work-stealing front. Outputs equal a single
engine's greedy outputs; a replica whose forward is held forces the others to steal (counts, not
timing); cancel works while queued and after dispatch; the queue bound refuses; shutdown drains.
A deadlock shows up as the pytest timeout."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runtime.engine.request import RequestHandle
from runtime.errors import Overloaded, ServiceUnavailable
from runtime.serving.replica_handle import ReplicaHandle
from runtime.serving.replicas import ReplicaSet
from tests.runtime.engine.support import (
    ModelHooks,
    RecordingSink,
    greedy,
    live_owners,
    make_engine,
    one_torch_thread,
    random_prompts,
    request,
)

pytestmark = [pytest.mark.usefixtures(one_torch_thread.__name__), pytest.mark.timeout(120)]


def make_set(
    model_dir: Path, n: int, sink: RecordingSink, **kwargs: Any
) -> tuple[ReplicaSet, list[Callable[[], ModelHooks]]]:
    built = [make_engine(model_dir, sink) for _ in range(n)]
    replicas = ReplicaSet([engine for engine, _ in built], sink=sink, **kwargs)
    replicas.load()
    replicas.start()
    return replicas, [hooks for _, hooks in built]


def until(condition: Callable[[], bool]) -> None:
    """Poll; the test's timeout is the failure detector."""
    while not condition():
        time.sleep(0.002)


def dispatched(handle: RequestHandle) -> bool:
    assert isinstance(handle, ReplicaHandle)
    return handle.inner is not None


def single_engine_tokens(model_dir: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    engine, _ = make_engine(model_dir)
    try:
        handles = [engine.submit(request(f"ref{i}", p, greedy(n))) for i, p in enumerate(prompts)]
        return [h.result().token_ids for h in handles]
    finally:
        engine.shutdown()


def test_skewed_load_is_stolen_and_matches_single_engine(demo_model_dir) -> None:
    model_dir = demo_model_dir("llama")
    prompts = random_prompts(12, 2, 20, vocab=500, seed=3)
    expected = single_engine_tokens(model_dir, prompts, 6)
    sink = RecordingSink()
    replicas, hooks = make_set(model_dir, 3, sink, max_inflight=2)
    try:
        hooks[0]().hold()  # replica 0 can hold 2 requests and finish none of them
        handles = [
            replicas.submit(request(f"r{i}", p, greedy(6)), replica=0)  # all on replica 0
            for i, p in enumerate(prompts)
        ]
        until(lambda: len(replicas.queues) == 0)  # replicas 1 and 2 took the rest: stealing
        hooks[0]().release()
        outputs = [h.result() for h in handles]
        stats = replicas.pool_stats()
    finally:
        hooks[0]().release()
        replicas.shutdown(drain_timeout_s=30.0)
    assert [o.token_ids for o in outputs] == expected
    assert all(o.finished_reason == "length" for o in outputs)
    assert stats.num_taken == 12 and stats.num_completed == 12
    assert stats.processed_per_worker[0] <= 2  # held: it never had room for a third
    assert stats.num_steals == 12 - stats.processed_per_worker[0] >= 10
    assert replicas.num_steals == stats.num_steals
    assert all(live_owners(engine) == [] for engine in replicas.replicas)


def test_cancel_while_queued_and_after_dispatch(demo_model_dir) -> None:
    sink = RecordingSink()
    replicas, hooks = make_set(demo_model_dir("llama"), 2, sink, max_inflight=1)
    try:
        for h in hooks:
            h().hold()
        first = replicas.submit(request("a", [5, 6, 7], greedy(8)), replica=0)
        second = replicas.submit(request("b", [8, 9], greedy(4)), replica=1)
        until(lambda: dispatched(first) and dispatched(second))
        queued = replicas.submit(request("q", [10, 11], greedy(4)))
        later = replicas.submit(request("l", [12, 13], greedy(4)))
        assert not dispatched(queued) and not queued.finished
        assert replicas.cancel("q") and queued.finished
        assert queued.result().finished_reason == "cancelled"
        assert [o.finished_reason for o in queued] == ["cancelled"]
        assert replicas.cancel("a")  # on replica 0's engine now
        assert not replicas.cancel("q")  # already ended
        for h in hooks:
            h().release()
        assert first.result().finished_reason == "cancelled"
        assert second.result().finished_reason == "length"
        assert len(later.result().token_ids) == 4  # reached a replica after the cancels
    finally:
        for h in hooks:
            h().release()
        replicas.shutdown(drain_timeout_s=30.0)
    assert not dispatched(queued)  # the feeder skipped the cancelled request
    assert sink.by_id()["q"].finished_reason == "cancelled"
    assert replicas.pool_stats().num_taken == 4
    assert all(live_owners(engine) == [] for engine in replicas.replicas)


def test_async_consumer_of_a_queued_request(demo_model_dir) -> None:
    sink = RecordingSink()
    replicas, hooks = make_set(demo_model_dir("llama"), 2, sink, max_inflight=1)

    async def consume() -> list[int]:
        for h in hooks:
            h().hold()
        busy = [replicas.submit(request(f"b{i}", [3, 4], greedy(2)), replica=i) for i in (0, 1)]
        until(lambda: all(dispatched(b) for b in busy))
        handle = replicas.submit(request("x", [7, 8, 9], greedy(5)))
        streamed = asyncio.ensure_future(_collect(handle))
        await asyncio.sleep(0.01)
        assert not streamed.done() and not dispatched(handle)
        for h in hooks:
            h().release()
        return await streamed

    try:
        tokens = asyncio.run(consume())
    finally:
        for h in hooks:
            h().release()
        replicas.shutdown(drain_timeout_s=30.0)
    assert tokens == single_engine_tokens(demo_model_dir("llama"), [[7, 8, 9]], 5)[0]


async def _collect(handle: RequestHandle) -> list[int]:
    return [t async for outs in handle.batches() for out in outs for t in out.token_ids]


def test_queue_bound_refuses_and_shutdown_drains(demo_model_dir) -> None:
    sink = RecordingSink()
    replicas, hooks = make_set(demo_model_dir("llama"), 2, sink, max_inflight=1, max_queued=3)
    try:
        for h in hooks:
            h().hold()
        running = [replicas.submit(request(f"r{i}", [4, 5], greedy(3)), replica=i) for i in (0, 1)]
        until(lambda: all(dispatched(r) for r in running))
        queued = [replicas.submit(request(f"q{i}", [6, i + 7], greedy(3))) for i in range(3)]
        with pytest.raises(Overloaded):
            replicas.submit(request("over", [1, 2], greedy(3)))
        assert sink.by_id()["over"].failure_reason == "overloaded"
        for h in hooks:
            h().release()
        replicas.shutdown(drain_timeout_s=60.0)  # queued requests still reach a replica
    finally:
        for h in hooks:
            h().release()
        replicas.shutdown(drain_timeout_s=30.0)
    assert all(h.result().finished_reason == "length" for h in running + queued)
    with pytest.raises(ServiceUnavailable):
        replicas.submit(request("late", [1, 2], greedy(3)))


def test_shutdown_without_grace_fails_queued_requests(demo_model_dir) -> None:
    sink = RecordingSink()
    replicas, hooks = make_set(demo_model_dir("llama"), 2, sink, max_inflight=1)
    for h in hooks:
        h().hold()
    running = [replicas.submit(request(f"r{i}", [4, 5], greedy(3)), replica=i) for i in (0, 1)]
    until(lambda: all(dispatched(r) for r in running))
    queued = replicas.submit(request("q", [6, 7], greedy(3)))
    stopper = threading.Thread(target=replicas.shutdown, args=(0.0,))
    stopper.start()
    with pytest.raises(ServiceUnavailable):
        queued.result()
    for h in hooks:
        h().release()
    stopper.join()
    assert sink.by_id()["q"].failure_reason == "internal"
    assert all(live_owners(engine) == [] for engine in replicas.replicas)


def test_server_wiring_builds_a_set_and_exports_steals(demo_model_dir) -> None:
    from runtime.server.wiring import build_state
    from tests.runtime.server.live import light_settings

    settings = light_settings(
        model_path=str(demo_model_dir("llama")),
        model_name="tiny",
        num_replicas=2,
        tracing_enabled=False,
        max_num_seqs=2,  # replica 0 holds at most 2 running + 2 waiting (the feeder's max_waiting)
        initial_num_seqs=2,
        min_num_seqs=1,
    )
    state = build_state(settings)
    replicas = state.router.pick("tiny").engine
    assert isinstance(replicas, ReplicaSet) and len(replicas.replicas) == 2
    replicas.load()
    replicas.start()
    hooks = ModelHooks(replicas.replicas[0].loaded)
    try:
        hooks.hold()  # replica 0 fills up (<= 4 requests): replica 1 must steal the rest
        handles = [
            replicas.submit(request(f"w{i}", [5, i + 6], greedy(3)), replica=0) for i in range(8)
        ]
        until(lambda: len(replicas.queues) == 0)
        hooks.release()
        assert all(h.result().finished_reason == "length" for h in handles)
        steals = replicas.num_steals
        assert steals == 8 - replicas.pool_stats().processed_per_worker[0] >= 4
        # a step after the steals syncs the counter: one more request (which may be stolen too)
        replicas.submit(request("sync", [3, 4], greedy(2)), replica=1).result()
        steals = replicas.num_steals
    finally:
        hooks.release()
        state.shutdown_engines(10.0)
        for stop in state.on_stop:
            stop()
    assert state.registry.get_sample_value("fastllm_scheduler_steals_total") == steals
