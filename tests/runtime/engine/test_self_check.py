"""Issue 29, item 5: the idle self-check. After real requests an idle engine is clean (every page
free or cached, no orphan block); a deliberately leaked page and an orphan block are caught, with
their owners, in the log and in the two gauges."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry

from monitoring.self_check import SelfCheckCollector
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.engine.self_check import IdleSelfCheck
from runtime.engine.stats import FanOut


@pytest.fixture
def engine(demo_model_dir: Callable[[str], Path]) -> Iterator[Engine]:
    from runtime.memory import Allocator

    config = EngineConfig(model_path=demo_model_dir("llama"), model_name="tiny", device="cpu")
    # its own allocator: the process-wide one is shared by the worker's other tests' engines
    engine = Engine(config, FanOut(), allocator=Allocator(device="cpu"))
    engine.load()
    engine.start()
    yield engine
    engine.shutdown(drain_timeout_s=5)


def _wait_for_check(engine: Engine, after: int) -> None:
    """Until the engine's own idle hook has run a check past `after` (bounded, not timed)."""
    for _ in range(400):
        result = engine.self_check_result()
        if result is not None and result.num_checks > after:
            return
        time.sleep(0.05)
    raise AssertionError("the idle self-check never ran")


def test_an_idle_engine_after_real_requests_is_clean(engine: Engine) -> None:
    prompt = list(range(5, 60))  # several pages; the repeat is a prefix hit
    for i in range(3):
        handle = engine.submit(GenerationRequest(f"r{i}", prompt, SamplingParams(max_tokens=4)))
        assert handle.result().completion_tokens == 4
    _wait_for_check(engine, after=0)
    result = engine.self_check_result()
    assert result is not None and result.is_clean
    assert engine.kv_cache_stats().num_cached_pages > 0  # cached pages are not leaks


def test_a_leaked_page_and_an_orphan_block_are_caught_with_their_owners(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    check = engine.self_check
    assert check is not None
    ghost = check.kv.allocate("req-ghost", list(range(1, 40)))  # KV nobody will ever free
    assert check.kv.ensure(ghost, 39)
    orphan = check.allocator.alloc((256,), torch.float32, owner="debug-leak:req-gone")
    caplog.set_level(logging.WARNING, logger="runtime.engine.self_check")
    result = check.check(time.monotonic())
    assert result.leaked_pages == len(ghost.page_ids) == 3  # 39 tokens, 16 a page
    assert result.page_owners == ("req-ghost",)
    assert result.orphan_blocks == 1 and result.orphan_owners == ("debug-leak:req-gone",)
    # logged once per change (by this check or by the engine's own idle hook meanwhile)
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        "3 KV pages held while idle (holders: req-ghost)" in line and "debug-leak:req-gone" in line
        for line in lines
    ), lines
    registry = CollectorRegistry()
    registry.register(SelfCheckCollector([("tiny", "stable", engine.self_check_result)]))
    labels = {"model": "tiny", "version": "stable"}
    assert registry.get_sample_value("fastllm_kv_leaked_pages", labels) == 3
    assert registry.get_sample_value("fastllm_allocator_orphan_blocks", labels) == 1
    # once they are given back, the next check is clean again
    check.kv.free("req-ghost")
    check.allocator.release(orphan)
    assert check.check(time.monotonic()).is_clean


def test_a_live_request_owns_its_blocks_and_the_check_waits_for_idle(engine: Engine) -> None:
    check = engine.self_check
    assert check is not None
    block = check.allocator.alloc((64,), torch.float32, owner="debug-leak:req-live")
    assert check.check(0.0, live_ids={"req-live"}).is_clean  # its owner still runs
    fresh = IdleSelfCheck(check.kv, check.allocator, idle_s=1.0)
    fresh.on_idle(10.0, num_steps=7, live_ids=())  # the idle period starts
    fresh.on_idle(10.5, num_steps=7, live_ids=())  # not idle long enough
    assert fresh.last is None
    fresh.on_idle(11.2, num_steps=7, live_ids=())
    assert fresh.last is not None and fresh.last.orphan_blocks == 1
    fresh.on_idle(20.0, num_steps=7, live_ids=())  # once per idle period
    assert fresh.last.num_checks == 1
    fresh.on_idle(20.1, num_steps=8, live_ids=())  # it worked: a new period
    fresh.on_idle(21.2, num_steps=8, live_ids=())
    assert fresh.last.num_checks == 2
    check.allocator.release(block)


def test_engines_sharing_an_allocator_own_each_others_blocks(
    demo_model_dir: Callable[[str], Path],
) -> None:
    """A canary or an embedding model on the same device shares the allocator: one engine's idle
    check sees the other's KV pool rows and its running requests' pages, none an orphan."""
    from runtime.memory import Allocator

    allocator = Allocator(device="cpu")
    engines = [
        Engine(
            EngineConfig(model_path=demo_model_dir("llama"), model_name=name, device="cpu"),
            FanOut(),
            allocator=allocator,
        )
        for name in ("idle", "busy")
    ]
    idle, busy = engines
    try:
        for engine in engines:
            engine.load()
            engine.start()
        params = SamplingParams(max_tokens=1900, ignore_eos=True)
        handle = busy.submit(GenerationRequest("req-busy", list(range(5, 60)), params))
        for _ in range(400):  # until its pages exist (bounded, not timed)
            if "req-busy" in {r.owner for r in busy.self_check.kv.report()}:  # type: ignore[union-attr]
                break
            time.sleep(0.05)
        owners = {b.owner for b in allocator.leak_report()}
        assert "req-busy" in owners and any(o.startswith("kv-cache:busy/") for o in owners)
        assert idle.self_check is not None
        result = idle.self_check.check(time.monotonic())
        assert result.is_clean, result
        handle.cancel()
    finally:
        for engine in engines:
            engine.shutdown(drain_timeout_s=5)


def test_the_debug_leak_dies_with_its_engine(demo_model_dir: Callable[[str], Path]) -> None:
    """The process-wide allocator outlives an engine (a reload, the next test on this worker):
    CI once saw 15,296 `debug-leak:` blocks of an earlier test's server as this file's orphans."""
    from runtime.memory import Allocator

    allocator = Allocator(device="cpu")
    config = EngineConfig(
        model_path=demo_model_dir("llama"),
        model_name="leaky",
        device="cpu",
        debug_leak_blocks_per_request=3,
    )
    leaky = Engine(config, FanOut(), allocator=allocator)
    leaky.load()
    leaky.start()
    for i in range(2):
        leaky.submit(GenerationRequest(f"l{i}", [5, 6, 7], SamplingParams(max_tokens=2))).result()

    def num_leaked() -> int:
        return sum(b.owner.startswith("debug-leak:") for b in allocator.leak_report())

    for _ in range(200):  # the leak runs as a sequence closes, just after its result is out
        if num_leaked() == 6:
            break
        time.sleep(0.05)
    assert num_leaked() == 6  # held while the engine lives
    leaky.shutdown(drain_timeout_s=5)
    assert num_leaked() == 0
