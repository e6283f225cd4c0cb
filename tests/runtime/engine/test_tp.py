"""Tensor parallelism (runtime.engine.tp, runtime.models.parallel) on CPU: gloo, two processes.

Rank 0's logits from the sharded model against `transformers` (a reference nobody here wrote)
and against the one-process model; the engine's greedy tokens under TP=2 against TP=1 (with
n > 1, whose fork copies a page on every rank, and a prefix-cache hit); sampled verification
on the split model (the reference gathers the other ranks' layers); a killed worker: its
in-flight request fails with 503, the workers restart once, the next request succeeds, no page
is left held; sizes that do not divide the model: one line."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry

from monitoring.tp_metrics import TPRestartsCollector
from runtime.engine.engine import Engine
from runtime.engine.tp import PoolSpec, StepMessage, TPWorld, WorkerSpec
from runtime.engine.tp.build import check, load_parallel
from runtime.errors import ConfigError, ServiceUnavailable
from runtime.memory.kv_pool import SequenceKV
from runtime.models.batch_plan import SeqSlice
from runtime.models.loader import load_model, read_args
from runtime.models.parallel.load import load_shard
from runtime.models.parallel.shard import ShardSpec, check_tp
from runtime.verify.verifier import Verifier
from tests.runtime.engine.support import (
    RecordingSink,
    engine_config,
    greedy,
    one_torch_thread,
    request,
)

__all__ = ["one_torch_thread"]  # the fixture, imported for use here

PROMPTS = [[5, 17, 33, 99, 100], [7, 8, 9], list(range(40, 75))]  # the last spans pages
KV_BYTES = 4 << 20  # a small pool: the worker's is the same size


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Two processes on a shared 2-core machine: one intra-op thread each."""


def _shard_logits(
    model_dir: Path, prompt: list[int], quantization: str | None = None, world_size: int = 2
) -> torch.Tensor:
    """Rank 0's logits for `prompt` with `world_size - 1` workers: the step sent by hand, as
    the runner does."""
    spec = WorkerSpec(
        str(model_dir),
        world=world_size,
        master_addr="127.0.0.1",
        master_port=0,
        timeout_s=60.0,
        num_threads=1,
        quantization=quantization,
    )
    world = TPWorld(spec)
    world.start()
    try:
        loaded = load_shard(
            model_dir, ShardSpec(0, world_size), load_tokenizer=False, quantization=quantization
        )
        args = loaded.args
        kv = SequenceKV.empty(args.num_layers, args.num_kv_heads, args.head_dim, capacity=64)
        pool = kv.data
        world.send_pool(
            PoolSpec(
                args.num_layers, args.num_kv_heads, int(pool.shape[3]), kv.page_size, args.head_dim
            )
        )
        ids = torch.tensor(prompt)
        slices = [SeqSlice(0, len(prompt), kv)]
        world.send_step(StepMessage.of(ids, slices, []))
        assert loaded.model.tp_world == world_size
        hidden = loaded.model(ids, slices)
        return loaded.model.compute_logits(hidden)  # type: ignore[operator]
    finally:
        world.shutdown()


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_sharded_logits_match_transformers_and_one_process(
    arch: str, demo_model_dir: Callable[[str], Path]
) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = demo_model_dir(arch)
    prompt = PROMPTS[2]
    tp2 = _shard_logits(model_dir, prompt)
    single = load_model(model_dir, device="cpu", load_tokenizer=False)
    args = single.args
    kv = SequenceKV.empty(args.num_layers, args.num_kv_heads, args.head_dim, capacity=64)
    ids = torch.tensor(prompt)
    tp1 = single.model.compute_logits(single.model(ids, [SeqSlice(0, len(prompt), kv)]))
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = hf(ids[None]).logits[0].float()
    assert tp2.shape == reference.shape
    torch.testing.assert_close(tp2, reference, atol=1e-4, rtol=0)
    torch.testing.assert_close(tp2, tp1, atol=1e-4, rtol=0)


def test_sizes_that_do_not_divide_are_one_line(demo_model_dir: Callable[[str], Path]) -> None:
    args = read_args(demo_model_dir("llama"))  # 4 heads, 2 KV heads, intermediate 176
    with pytest.raises(ConfigError) as info:
        check_tp(args, 3)
    assert str(info.value) == "tensor_parallel_size 3 does not divide the model's 4 attention heads"
    with pytest.raises(ConfigError, match="KV heads"):
        check_tp(replace(args, num_heads=6, num_kv_heads=3), 2)
    with pytest.raises(ConfigError, match="176 intermediate size"):  # heads divide, 176 not
        check_tp(replace(args, num_heads=32, num_kv_heads=32), 32)
    config = engine_config(model_path=demo_model_dir("llama"), tensor_parallel_size=3)
    with pytest.raises(ConfigError, match="does not divide") as info:
        check(config)  # what the engine's load runs before any process starts
    assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def engines(demo_model_dir: Callable[[str], Path]) -> Iterator[tuple[Engine, Engine]]:
    model_dir = demo_model_dir("llama")
    common = {
        "model_path": model_dir,
        "kv_cache_bytes": KV_BYTES,
        "batch_warmup": False,
        "num_threads": 1,
    }
    one = Engine(engine_config(**common))
    two = Engine(engine_config(**common, tensor_parallel_size=2, tensor_parallel_timeout_s=10.0))
    yield one, two
    two.shutdown()
    one.shutdown()


def _tokens(engine: Engine, prompts: list[list[int]], **params: object) -> list[list[int]]:
    handles = [
        engine.submit(request(f"r{i}-{time.monotonic_ns()}", p, greedy(32, **params)))
        for i, p in enumerate(prompts)
    ]
    return [h.result(timeout=300).token_ids for h in handles]


def test_engine_greedy_tokens_match_one_process(engines: tuple[Engine, Engine]) -> None:
    one, two = engines
    expected = _tokens(one, PROMPTS)
    assert _tokens(two, PROMPTS) == expected
    assert all(len(t) == 32 for t in expected)
    # the same prompts again: prefix-cache hits on rank 0's pages, the workers' pages reused
    assert _tokens(two, PROMPTS) == expected
    assert two.kv_cache_stats().prefix_hit_tokens > 0


def test_memory_per_rank(engines: tuple[Engine, Engine]) -> None:
    _, two = engines
    world = two._parts.loaded.parallel
    assert isinstance(world, TPWorld)
    rows = two.tp_memory()
    assert rows is not None and [r["rank"] for r in rows] == [0, 1]
    assert rows[1]["pid"] == world.procs[0].pid and rows[0]["pid"] == os.getpid()
    pool = two._parts.kv_cache.pool.data
    for row in rows:
        assert row["alive"] and row["rss_bytes"] > 0
        assert row["kv_pool_bytes"] == pool.numel() * 4  # fp32, this rank's KV heads
        assert row["weight_bytes"] > 0
    registry = CollectorRegistry()
    registry.register(TPRestartsCollector([], [("tiny", "v1", two.tp_memory)]))
    labels = {"model": "tiny", "version": "v1", "rank": "1", "type": "kv_pool"}
    assert registry.get_sample_value("fastllm_tp_rank_memory_bytes", labels) == pool.numel() * 4


def test_engine_n_choices_match_one_process(engines: tuple[Engine, Engine]) -> None:
    one, two = engines
    # n = 2 forks after the prefill: the partial last page is copied on every rank
    expected = _tokens(one, PROMPTS[:2], n=2)
    assert _tokens(two, PROMPTS[:2], n=2) == expected


class _VerifyNamed(Verifier):
    """Verifies the requests whose id says so (the fixture's engines serve the other tests)."""

    def should_verify(self, request_id: str) -> bool:
        return request_id.startswith("verify-")


def test_verification_under_tp_gathers_the_other_ranks(engines: tuple[Engine, Engine]) -> None:
    """A sampled request on the split model is recomputed on the reference path, which gathers
    rank 1's layers (runtime.models.parallel.gather): its logit probe agrees with production
    within the fp32 tolerance, and the per-op probes run on rank 0's slices."""
    _, two = engines
    sink = RecordingSink()
    verifier = _VerifyNamed(sink, sample_rate=0.0, num_threads=1)
    two.verifier = verifier
    try:
        handles = [two.submit(request(f"verify-{i}", p, greedy(8))) for i, p in enumerate(PROMPTS)]
        for handle in handles:
            handle.result(timeout=300)
        assert verifier.flush(timeout=120)
    finally:
        two.verifier = None
        verifier.close()
    assert verifier.num_verified == len(PROMPTS) and verifier.num_failed == 0
    by_op = sink.by_op()
    assert len(by_op["logit"]) == len(PROMPTS)
    for result in by_op["logit"]:
        assert result.tolerance is not None and result.abs_error <= result.tolerance, result
    assert {"rms_norm", "rotary", "attention", "swiglu"} <= set(by_op)


def test_killed_worker_fails_in_flight_then_restarts(engines: tuple[Engine, Engine]) -> None:
    _, two = engines
    world = two._parts.loaded.parallel
    assert isinstance(world, TPWorld)
    restarts = world.num_restarts
    handle = two.submit(request("doomed", PROMPTS[0], greedy(2000)))
    for output in handle:  # in flight: it has produced tokens
        if output.token_ids:
            break
    world.procs[0].kill()
    with pytest.raises(ServiceUnavailable) as info:  # the API's 503, not a hang or a 500
        handle.result(timeout=300)
    assert info.value.http_status == 503
    assert "tensor-parallel worker lost" in str(info.value)
    assert world.num_restarts == restarts + 1
    registry = CollectorRegistry()
    registry.register(TPRestartsCollector([("tiny", "v1", two.tp_worker_restarts)]))
    sample = registry.get_sample_value(
        "fastllm_tp_worker_restarts_total", {"model": "tiny", "version": "v1"}
    )
    assert sample == restarts + 1
    one_result = _tokens(two, [PROMPTS[1]])
    assert len(one_result[0]) == 32
    assert two.kv_cache_stats().num_used_pages == 0
    # the restarted workers' pools are empty: rank 0 forgot its cached prefixes with them
    assert [b.owner for b in two.leak_report() if not b.owner.startswith("kv-cache:")] == []


def test_hung_worker_times_out_instead_of_hanging(engines: tuple[Engine, Engine]) -> None:
    """A worker that stops answering (SIGSTOP: alive, silent) fails the step after the
    collective timeout (10 s here), not never; it is killed and replaced like a dead one."""
    _, two = engines
    world = two._parts.loaded.parallel
    assert isinstance(world, TPWorld)
    restarts = world.num_restarts
    os.kill(world.procs[0].pid, signal.SIGSTOP)  # our own child, by its pid
    with pytest.raises(ServiceUnavailable):
        two.submit(request("stuck", PROMPTS[0], greedy(8))).result(timeout=300)
    assert world.num_restarts == restarts + 1
    assert len(_tokens(two, [PROMPTS[1]])[0]) == 32


def test_one_tensor_parallel_engine_per_process(
    engines: tuple[Engine, Engine], demo_model_dir: Callable[[str], Path]
) -> None:
    """torch.distributed has one default group per process: a second TP engine is refused with
    one line, and the first keeps serving."""
    _, two = engines
    config = engine_config(model_path=demo_model_dir("llama"), tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="one tensor-parallel engine per process"):
        load_parallel(config)
    assert len(_tokens(two, [PROMPTS[1]])[0]) == 32
