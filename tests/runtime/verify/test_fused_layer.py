"""Verification against the fused decoder layer: a fault in the layer's own fused sequence (its
ops clean) still shows in the production logit, while every op probe stays clean. (A corrupted
op, `ops.rotary` included, is pinpointed: tests/runtime/verify/test_verifier.py.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from runtime.models.layers import DecoderLayer
from storage.audit import default_threshold
from tests.runtime.verify.support import (
    Recorder,
    corrupting,
    random_prompts,
    serve,
    verified_engine,
)

FP32 = default_threshold("float32")
OPS = {"rms_norm", "rotary", "attention", "swiglu"}


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _serve_verified(path: Path) -> Recorder:
    recorder = Recorder()
    with verified_engine(path, [recorder]) as (engine, verifier):
        serve(engine, random_prompts(6, 500, seed=5), max_tokens=4)
        assert verifier.flush(timeout=60)
    return recorder


def test_a_fault_in_the_fused_layer_alone_shows_in_the_logit(
    demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken fused half (5% of its output lanes garbage) leaves every op probe clean: only
    the production logit, which that forward produced, disagrees with the reference path."""
    monkeypatch.setattr(DecoderLayer, "attn_out_mlp", corrupting(DecoderLayer.attn_out_mlp))
    by_op = _serve_verified(demo_model_dir("llama")).by_op()
    for op in OPS:
        assert all(r.abs_error <= FP32 for r in by_op[op]), op
    assert len(by_op["logit"]) == 6
    assert all(r.abs_error > FP32 for r in by_op["logit"])
