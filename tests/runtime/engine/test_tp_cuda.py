"""Tensor parallelism on NCCL: two GPUs, the engine's greedy tokens under TP=2 against TP=1 on
the tiny llama (fp32), and logits within 1e-4 (runtime.engine.tp on CUDA: the all_reduces on
NCCL, the step broadcast on the gloo control group). Needs two CUDA devices."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from runtime.engine.engine import Engine
from tests.runtime.engine.support import engine_config, greedy, request

pytestmark = pytest.mark.cuda

PROMPTS = [[5, 17, 33, 99, 100], [7, 8, 9], list(range(40, 75))]


@pytest.mark.timeout(600)
def test_nccl_greedy_tokens_match_one_gpu(demo_model_dir: Callable[[str], Path]) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA devices for NCCL; {torch.cuda.device_count()} visible")
    common = {"model_path": demo_model_dir("llama"), "device": "cuda", "kv_cache_bytes": 4 << 20}
    outputs = []
    for size in (1, 2):
        engine = Engine(engine_config(**common, tensor_parallel_size=size))
        try:
            handles = [
                engine.submit(request(f"r{i}-{time.monotonic_ns()}", p, greedy(32)))
                for i, p in enumerate(PROMPTS)
            ]
            outputs.append([h.result(timeout=300).token_ids for h in handles])
        finally:
            engine.shutdown()
    assert outputs[0] == outputs[1]
