"""The real model quantized as an operator would serve it (`--quantization int4
--quantize-lm-head`): SmolLM2-135M's logits run near 30, where bf16 values lie 0.125 apart, and
its healthy kernels used to record every `logit` probe as an anomaly against the flat 5e-2
(issue 39). Each logit is now checked against the tolerance it carries (runtime.verify.tolerance),
so a healthy model gives none while a corrupted kernel still shows on nearly every request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runtime.engine.engine import Engine, EngineConfig
from runtime.memory import Allocator
from runtime.models.loader import LoadedModel, load_model
from runtime.models.quant import Int4Linear
from runtime.models.quantize import runs_cpu_kernels
from runtime.verify.tolerance import chain_dtype, default_threshold, logit_tolerance
from runtime.verify.verifier import Verifier
from tests.runtime.engine.support import RecordingSink
from tests.runtime.verify.support import _corrupt, random_prompts, serve

NUM_REQUESTS = 24
BASE = default_threshold("float32", "int4")


@pytest.fixture(autouse=True)
def _two_torch_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def int4_smollm2(smollm2_dir: Path) -> LoadedModel:
    """Loaded and quantized once for both tests (the load was most of the shorter test's time):
    an engine changes none of its weights, and the corrupted kernel is patched on the class."""
    return load_model(smollm2_dir, device="cpu", quantization="int4", quantize_lm_head=True)


def _run(loaded: LoadedModel, num_prompts: int) -> RecordingSink:
    recorder = RecordingSink()
    verifier = Verifier(recorder, sample_rate=1.0, queue_size=4096)
    engine = Engine(
        EngineConfig(
            model_name="smollm2", device="cpu", max_num_seqs=32, initial_num_seqs=32,
            quantization="int4",
            batch_warmup=False,  # the batch policy's sweep (1..32 on a 135M model) is not tested
        ),
        recorder,
        loader=lambda: loaded,
        allocator=Allocator(device="cpu"),
        verifier=verifier,
    )  # fmt: skip
    prompts = random_prompts(num_prompts, 40_000, max_len=24, seed=5)
    try:
        for start in range(0, num_prompts, 8):  # a few at a time: each waits at most 120 s
            serve(engine, prompts[start : start + 8], max_tokens=3, prefix=f"r{start}")
        assert verifier.flush(timeout=300)
    finally:
        engine.shutdown(drain_timeout_s=5.0)
        verifier.close(timeout=60.0)
    assert verifier.num_failed == 0
    return recorder


def test_a_healthy_int4_smollm2_with_an_int8_head_has_no_anomaly(
    int4_smollm2: LoadedModel,
) -> None:
    logits = _run(int4_smollm2, NUM_REQUESTS).by_op()["logit"]
    assert len(logits) == NUM_REQUESTS
    # the case of the issue: logits large enough that bf16's spacing exceeds the flat threshold
    assert max(abs(r.expected) for r in logits) > 16.0
    # bf16's chain on torch's kernels; on an AVX2 CPU's own kernels the int8-activation chain
    chain = chain_dtype(
        torch.float32,
        is_quantized=True,
        int8_activations=runs_cpu_kernels(int4_smollm2.model),
    )
    for r in logits:
        assert r.tolerance == logit_tolerance(BASE, chain, r.expected)
    assert [r for r in logits if r.is_anomaly(BASE)] == []


def test_a_corrupted_int4_kernel_of_smollm2_is_caught(
    int4_smollm2: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    intact = Int4Linear.forward

    def broken(self: Int4Linear, x: torch.Tensor) -> torch.Tensor:
        return _corrupt(intact(self, x), 0.05)

    monkeypatch.setattr(Int4Linear, "forward", broken)
    logits = _run(int4_smollm2, 8).by_op()["logit"]
    assert len(logits) == 8
    assert sum(r.is_anomaly(BASE) for r in logits) >= 6  # nearly every request shows it
