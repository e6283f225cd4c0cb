"""Verification of a quantized model measures kernel error, not quantization error: the reference
computes with the dequantized values of the same quantized weights (DESIGN.md "Quantized
weights"), so an intact int4/int8 model gives no anomaly at its threshold and a corrupted
quantized kernel is still caught."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from runtime.engine.engine import Engine, EngineConfig
from runtime.memory import Allocator
from runtime.models.loader import load_model
from runtime.models.quant import Int4Linear, Int8Linear
from runtime.verify.verifier import Verifier
from storage.audit import default_threshold
from tests.runtime.engine.support import RecordingSink
from tests.runtime.verify.support import _corrupt, random_prompts, serve


def _run(model_dir: Path, method: str, num_prompts: int, head: bool = False) -> RecordingSink:
    recorder = RecordingSink()
    verifier = Verifier(recorder, sample_rate=1.0, queue_size=4096)
    engine = Engine(
        EngineConfig(
            model_name="tiny", device="cpu", max_num_seqs=64, initial_num_seqs=64,
            quantization=method,
        ),
        recorder,
        loader=lambda: load_model(
            model_dir, device="cpu", quantization=method, quantize_lm_head=head
        ),
        allocator=Allocator(device="cpu"),
        verifier=verifier,
    )  # fmt: skip
    try:
        serve(engine, random_prompts(num_prompts, 500, seed=4), max_tokens=3)
        assert verifier.flush(timeout=120)
    finally:
        engine.shutdown(drain_timeout_s=5.0)
        verifier.close(timeout=60.0)
    assert verifier.num_failed == 0
    return recorder


@pytest.mark.parametrize(("method", "head"), [("int8", False), ("int4", False), ("int4", True)])
def test_an_intact_quantized_model_has_no_anomaly(
    method: str, head: bool, demo_model_dir: Callable[[str], Path]
) -> None:
    """head: the int8 LM head (quantize_lm_head), which the logit probe's reference reads as the
    dequantized rows of the same codes."""
    threshold = default_threshold("float32", method)
    recorder = _run(demo_model_dir("llama"), method, 16, head)
    logits = recorder.by_op()["logit"]
    assert len(logits) == 16
    assert all(r.abs_error <= threshold for r in logits), max(r.abs_error for r in logits)


@pytest.mark.parametrize("layer_cls, method", [(Int4Linear, "int4"), (Int8Linear, "int8")])
def test_a_corrupted_quantized_kernel_is_caught(
    layer_cls: type, method: str, demo_model_dir: Callable[[str], Path], monkeypatch
) -> None:
    intact = layer_cls.forward

    def broken(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
        return _corrupt(intact(self, x), 0.05)

    monkeypatch.setattr(layer_cls, "forward", broken)
    threshold = default_threshold("float32", method)
    logits = _run(demo_model_dir("llama"), method, 8).by_op()["logit"]
    assert len(logits) == 8
    assert sum(r.abs_error > threshold for r in logits) >= 6  # nearly every request shows it


def test_a_corrupted_int8_lm_head_is_caught(
    demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's kernel is corrupted only where its output is the vocabulary (the layers'
    int8 projections stay intact): the logit probe, which reads the head's rows, sees it."""
    intact = Int8Linear.forward

    def broken(self: Int8Linear, x: torch.Tensor) -> torch.Tensor:
        out = intact(self, x)
        return _corrupt(out, 0.05) if self.out_features > 256 else out

    monkeypatch.setattr(Int8Linear, "forward", broken)
    threshold = default_threshold("float32", "int4")
    logits = _run(demo_model_dir("llama"), "int4", 8, head=True).by_op()["logit"]
    assert len(logits) == 8
    assert sum(r.abs_error > threshold for r in logits) >= 6
