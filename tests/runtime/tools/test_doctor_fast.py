"""`fastllm doctor`'s fast-path check: passes on the demo models (tokens identical, rates
reported), fails naming the fix when the fast step disagrees with the eager forward."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.models.fast import pieces
from runtime.models.fast.build import FastPathOptions
from runtime.models.fast.decoder import FusedDecoder
from runtime.models.loader import load_model
from runtime.tools.doctor import FAIL, PASS, SKIP, DoctorOptions, run_checks
from runtime.tools.doctor_fast import NAME, check_fast_path
from tests.runtime.verify.support import corrupting


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_passes_on_the_demo_models(arch: str, demo_model_dir: Callable[[str], Path]) -> None:
    results = run_checks(DoctorOptions(model_path=demo_model_dir(arch), device="cpu"))
    (fast,) = [r for r in results if r.name == NAME]
    assert fast.status == PASS, fast.detail
    assert "8 tokens identical" in fast.detail and "fused" in fast.detail
    assert "tok/s vs eager" in fast.detail


def test_a_broken_fast_step_fails_with_the_fix(
    demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    original_init = FusedDecoder.__init__

    def init(self: FusedDecoder, model) -> None:  # type: ignore[no-untyped-def]
        original_init(self, model)
        self.attn_out_mlp = corrupting(pieces.attn_out_mlp)

    monkeypatch.setattr(FusedDecoder, "__init__", init)
    loaded = load_model(demo_model_dir("llama"), device="cpu")
    result = check_fast_path(loaded)
    assert result.status == FAIL and "max |logit diff|" in result.detail
    assert "--compile off" in result.fix


def test_skips_when_compile_is_off(demo_model_dir: Callable[[str], Path]) -> None:
    loaded = load_model(demo_model_dir("llama"), device="cpu")
    assert check_fast_path(loaded, FastPathOptions(compile="off")).status == SKIP
