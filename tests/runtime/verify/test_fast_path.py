"""Verification with production decoding on the fast path: a corrupted op is still pinpointed,
and a fault in the fast path alone (its ops clean) still shows in the production logit."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from runtime.models import ops
from runtime.models.fast import pieces
from runtime.models.fast.decoder import FusedDecoder
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


def _serve_verified(path: Path) -> tuple[Recorder, int]:
    recorder = Recorder()
    with verified_engine(path, [recorder]) as (engine, verifier):
        serve(engine, random_prompts(6, 500, seed=5), max_tokens=4)
        assert verifier.flush(timeout=60)
        num_fast = engine._parts.core.runner.num_fast_steps
    return recorder, num_fast


def test_a_corrupted_rotary_kernel_on_the_fast_path_is_pinpointed(
    demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # ops.rotary is the kernel the fast step calls directly (q and k in one call)
    monkeypatch.setattr(ops, "rotary", corrupting(ops.rotary))
    recorder, num_fast = _serve_verified(demo_model_dir("llama"))
    assert num_fast > 0  # decodes ran on the fast path
    by_op = recorder.by_op()
    assert len(by_op["rotary"]) == 6 and all(r.abs_error > FP32 for r in by_op["rotary"])
    for other in OPS - {"rotary"}:
        assert all(r.abs_error <= FP32 for r in by_op[other]), other
    assert any(r.abs_error > FP32 for r in by_op["logit"])


def test_a_fault_in_the_fast_step_alone_shows_in_the_logit(
    demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken fused piece (5% of its output lanes garbage) leaves every op probe clean: only
    the production logit, which the final decode step produced on the fast path, disagrees."""
    broken = corrupting(pieces.attn_out_mlp)
    original_init = FusedDecoder.__init__

    def init(self: FusedDecoder, model) -> None:  # type: ignore[no-untyped-def]
        original_init(self, model)
        self.attn_out_mlp = broken

    monkeypatch.setattr(FusedDecoder, "__init__", init)
    recorder, num_fast = _serve_verified(demo_model_dir("llama"))
    assert num_fast > 0
    by_op = recorder.by_op()
    for op in OPS:
        assert all(r.abs_error <= FP32 for r in by_op[op]), op
    assert len(by_op["logit"]) == 6
    assert all(r.abs_error > FP32 for r in by_op["logit"])
