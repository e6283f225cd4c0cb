"""Admission control, timeouts, internal errors and shutdown. The model's forward is held at a gate
where a test needs the engine to stand still, so no assertion depends on timing."""

from __future__ import annotations

import pytest

from runtime.errors import (
    EngineInternalError,
    InvalidRequestError,
    Overloaded,
    RequestTimeout,
    ServiceUnavailable,
)
from tests.runtime.engine.support import (
    RecordingSink,
    greedy,
    live_owners,
    make_engine,
    one_torch_thread,
    random_prompts,
    request,
)

QUEUE_BOUND = 8

pytestmark = pytest.mark.usefixtures(one_torch_thread.__name__)


@pytest.mark.timeout(120)
def test_ten_times_the_queue_bound_excess_is_refused_immediately(demo_model_dir) -> None:
    sink = RecordingSink()
    kv_budget = 256 * 1024
    engine, hooks = make_engine(
        demo_model_dir("llama"), sink, max_queued_requests=QUEUE_BOUND, kv_cache_bytes=kv_budget
    )
    engine.load()
    hooks().hold()
    first = engine.submit(request("first", [5, 6, 7], greedy(4)))
    assert hooks().entered.wait(30)  # the loop is parked inside the forward of `first`
    admitted, refused = [], []
    for i, prompt in enumerate(random_prompts(10 * QUEUE_BOUND, 4, 40, vocab=500)):
        try:
            admitted.append(engine.submit(request(f"q{i}", prompt, greedy(6))))
        except Overloaded as exc:
            assert exc.retry_after_s >= 1.0
            refused.append(i)
    # nothing left the queue while the loop stood still: exactly the bound got in
    assert len(admitted) == QUEUE_BOUND and len(refused) == 9 * QUEUE_BOUND
    assert engine.num_waiting == QUEUE_BOUND
    hooks().release()
    results = [h.result(timeout=60) for h in [first, *admitted]]
    assert all(r.finished_reason == "length" for r in results)
    engine.shutdown(drain_timeout_s=10)
    overloaded = [r for r in sink.by_id().values() if r.failure_reason == "overloaded"]
    assert len(overloaded) == 9 * QUEUE_BOUND
    kv_steps = [s.kv for s in sink.steps if s.kv is not None]
    assert 0 < max(kv.num_used_pages for kv in kv_steps) <= kv_steps[0].num_pages
    # the allocator holds the pool (reserved once, within the budget) and little else
    assert all(s.allocator is not None for s in sink.steps)
    assert max(s.allocator.bytes_in_use for s in sink.steps if s.allocator) <= kv_budget * 2
    assert live_owners(engine) == []


@pytest.mark.timeout(120)
def test_request_timeout_while_running_and_while_waiting(demo_model_dir) -> None:
    sink = RecordingSink()
    engine, hooks = make_engine(
        demo_model_dir("llama"), sink, max_num_seqs=1, min_num_seqs=1, initial_num_seqs=1
    )
    engine.load()
    hooks().sleep_s = 0.02  # 200 tokens take >= 4 s, far beyond the 0.3 s deadline
    slow = engine.submit(request("slow", [5, 6, 7], greedy(200), timeout_s=0.3))
    queued = engine.submit(request("queued", [5, 6], greedy(200), timeout_s=0.3))
    for handle in (slow, queued):
        outputs = list(handle)
        assert isinstance(outputs[-1].error, RequestTimeout)
        with pytest.raises(RequestTimeout):
            handle.result()
    hooks().sleep_s = 0.0
    assert engine.submit(request("ok", [5, 6], greedy(3))).result(timeout=60).completion_tokens == 3
    engine.shutdown(drain_timeout_s=10)
    stats = sink.by_id()
    assert stats["slow"].failure_reason == "timeout" and stats["slow"].first_token_ts is not None
    assert stats["queued"].failure_reason == "timeout"
    assert live_owners(engine) == []


@pytest.mark.timeout(120)
def test_a_failing_step_fails_its_requests_and_the_engine_lives_on(demo_model_dir) -> None:
    sink = RecordingSink()
    engine, hooks = make_engine(demo_model_dir("llama"), sink)
    engine.load()
    hooks().fail_next = 1
    broken = engine.submit(request("broken", [5, 6, 7], greedy(5)))
    with pytest.raises(EngineInternalError, match="injected model failure"):
        broken.result(timeout=60)
    assert live_owners(engine) == []  # its KV was freed with the failure
    fine = engine.submit(request("fine", [5, 6, 7], greedy(5))).result(timeout=60)
    assert fine.completion_tokens == 5
    engine.shutdown(drain_timeout_s=10)
    assert sink.by_id()["broken"].failure_reason == "internal"


@pytest.mark.timeout(120)
def test_a_scheduling_fault_fails_live_requests_and_the_loop_lives_on(
    demo_model_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a hang: a loop thread that died would leave every request waiting for its timeout."""
    sink = RecordingSink()
    engine, _ = make_engine(demo_model_dir("llama"), sink)
    engine.load()
    scheduler = engine._parts.core.scheduler
    schedule = scheduler.schedule
    faults = [RuntimeError("injected scheduling fault")]

    def faulty(limit: int):
        if faults and scheduler.num_waiting:
            raise faults.pop()
        return schedule(limit)

    monkeypatch.setattr(scheduler, "schedule", faulty)
    broken = engine.submit(request("broken", [5, 6, 7], greedy(5)))
    with pytest.raises(EngineInternalError, match="injected scheduling fault"):
        broken.result(timeout=60)
    assert live_owners(engine) == []
    fine = engine.submit(request("fine", [5, 6, 7], greedy(5))).result(timeout=60)
    assert fine.completion_tokens == 5
    engine.shutdown(drain_timeout_s=10)
    assert sink.by_id()["broken"].failure_reason == "internal"


@pytest.mark.timeout(120)
def test_invalid_requests_are_typed_errors_with_the_param(demo_model_dir) -> None:
    engine, _ = make_engine(demo_model_dir("llama"), kv_cache_bytes=1 << 19)
    try:
        with pytest.raises(InvalidRequestError) as empty:
            engine.submit(request("e", [], greedy(4)))
        assert empty.value.param == "prompt"
        with pytest.raises(InvalidRequestError) as long:
            engine.submit(request("l", [5] * 2040, greedy(64)))
        assert long.value.param == "max_tokens"
        with pytest.raises(InvalidRequestError) as bad:
            engine.submit(request("t", [5, 6], greedy(0)))
        assert bad.value.param == "max_tokens"
        kv_cache = engine._parts.kv_cache
        assert 900 < kv_cache.max_tokens < 1500  # the pool: 63 pages of 16 tokens
        with pytest.raises(InvalidRequestError) as kv:  # it could never be scheduled
            engine.submit(request("k", [5] * 1500, greedy(4)))
        assert kv.value.param == "prompt"
        assert f"({kv_cache.max_tokens} tokens)" in str(kv.value)  # names the limit
        with pytest.raises(InvalidRequestError) as kv:  # alone it could run out of pages
            engine.submit(request("k", [5] * 900, greedy(200)))
        assert kv.value.param == "max_tokens"
        assert engine.submit(request("ok", [5] * 900, greedy(2))).result(timeout=60)
    finally:
        engine.shutdown()


@pytest.mark.timeout(120)
def test_shutdown_drains_in_flight_then_refuses(demo_model_dir) -> None:
    engine, _ = make_engine(demo_model_dir("llama"))
    handles = [engine.submit(request(f"d{i}", [5, 6, 7 + i], greedy(8))) for i in range(6)]
    engine.shutdown(drain_timeout_s=60)
    assert all(h.result(timeout=1).completion_tokens == 8 for h in handles)
    with pytest.raises(ServiceUnavailable):
        engine.submit(request("late", [5, 6], greedy(2)))
    assert live_owners(engine) == []


@pytest.mark.timeout(120)
def test_shutdown_without_grace_fails_what_is_left_and_frees_it(demo_model_dir) -> None:
    engine, hooks = make_engine(demo_model_dir("llama"))
    engine.load()
    hooks().sleep_s = 0.01
    handles = [engine.submit(request(f"s{i}", [5, 6, 7], greedy(500))) for i in range(4)]
    engine.shutdown(drain_timeout_s=0)
    for handle in handles:
        with pytest.raises(ServiceUnavailable):
            handle.result(timeout=10)
    assert live_owners(engine) == []
