"""The paged-KV parity and property checks on a CUDA device (`pytest -m cuda`): the engine on the
GPU (fp32) against transformers on the CPU, with prefix caching on, off and a page budget that
forces preemption; and the KV state machine with its pool in device memory."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

from runtime.engine.engine import Engine, EngineConfig
from runtime.memory import Allocator
from runtime.models.loader import load_model
from tests.runtime.engine.support import greedy, request
from tests.runtime.engine.test_paged_parity import CASES, NUM_REQUESTS, workload
from tests.runtime.memory.test_kv_properties import PagedKV

pytestmark = pytest.mark.cuda
__all__ = ["workload"]  # the fixture, shared with the CPU parity test


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", sorted(CASES))
def test_64_mixed_requests_on_cuda_match_transformers(
    case: str, demo_model_dir: Any, workload: Any
) -> None:
    prompts, max_tokens, expected = workload
    loaded = load_model(demo_model_dir("llama"), device="cuda")
    config = EngineConfig(
        model_name="tiny",
        device="cuda",
        max_num_batched_tokens=32,
        initial_num_seqs=16,
        min_num_seqs=16,
        **CASES[case],
    )
    engine = Engine(config, loader=lambda: loaded, allocator=Allocator(device="cuda"))
    try:
        handles = [
            engine.submit(request(f"r{i}", prompts[i], greedy(max_tokens[i])))
            for i in range(NUM_REQUESTS)
        ]
        outputs = [h.result(timeout=300).token_ids for h in handles]
    finally:
        engine.shutdown(drain_timeout_s=10)
    assert outputs == expected
    kv = engine.kv_cache_stats()
    assert kv.num_used_pages == 0
    if case == "preemption":
        assert kv.num_preemptions > 0


class PagedKVOnCuda(PagedKV):
    device = "cuda"


PagedKVOnCuda.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
class TestPagedKVOnCuda(PagedKVOnCuda.TestCase):  # type: ignore[name-defined,misc]
    pass
