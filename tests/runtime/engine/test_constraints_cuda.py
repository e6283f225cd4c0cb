"""Structured output on a CUDA device (`pytest -m cuda`): the bitmask goes to the device and
XGrammar's CUDA kernel masks the logits; constrained rows mixed with unconstrained ones, with and
without the fast decode step (CUDA graphs), still parse."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.engine.engine import Engine, EngineConfig
from runtime.memory import Allocator
from runtime.models.loader import load_model
from tests.runtime.engine.test_constraints import run_mixed

pytestmark = pytest.mark.cuda


@pytest.mark.timeout(600)
@pytest.mark.parametrize("compile_mode", ["off", "auto"])
def test_constrained_rows_parse_on_cuda(demo_model_dir: Any, compile_mode: str) -> None:
    loaded = load_model(demo_model_dir("llama"), device="cuda")
    config = EngineConfig(model_name="tiny", device="cuda", compile=compile_mode, max_num_seqs=16)
    engine = Engine(config, loader=lambda: loaded, allocator=Allocator(device="cuda"))
    try:
        run_mixed(engine, [1, 5, 9, 30], seed=3)
    finally:
        engine.shutdown(drain_timeout_s=10)
