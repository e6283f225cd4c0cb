"""`fastllm doctor`'s fast-path check: passes on the demo models (tokens identical, rates
reported), fails naming the fix when the built step disagrees with the model's forward, skips
when nothing is built. (inductor is swapped for the eager function, or a corrupting wrapper, here:
compiling on this CPU takes minutes.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.models.fast import precompiled
from runtime.models.fast.build import FastPathOptions
from runtime.models.loader import load_model
from runtime.tools.doctor import FAIL, PASS, SKIP, DoctorOptions, run_checks
from runtime.tools.doctor_fast import NAME, check_fast_path
from tests.fixtures.eager_graphs import eager_precompile
from tests.runtime.verify.support import corrupting


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_passes_on_the_demo_models(
    arch: str, demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precompiled, "precompile", eager_precompile())
    loaded = load_model(demo_model_dir(arch), device="cpu")
    fast = check_fast_path(loaded, FastPathOptions(compile="on"))
    assert fast.status == PASS, fast.detail
    assert "8 tokens identical" in fast.detail and "inductor" in fast.detail
    assert "tok/s vs eager" in fast.detail


def test_a_broken_fast_step_fails_with_the_fix(
    demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a "compiler" whose output is wrong in 5% of its lanes
    monkeypatch.setattr(precompiled, "precompile", eager_precompile(corrupting))
    loaded = load_model(demo_model_dir("llama"), device="cpu")
    result = check_fast_path(loaded, FastPathOptions(compile="on"))
    assert result.status == FAIL and "max |logit diff|" in result.detail
    assert "--compile off" in result.fix


def test_skips_when_nothing_is_built(demo_model_dir: Callable[[str], Path]) -> None:
    results = run_checks(DoctorOptions(model_path=demo_model_dir("llama"), device="cpu"))
    (fast,) = [r for r in results if r.name == NAME]
    assert fast.status == SKIP and "nothing built" in fast.detail  # compile=auto on a CPU
    loaded = load_model(demo_model_dir("llama"), device="cpu")
    assert check_fast_path(loaded, FastPathOptions(compile="off")).status == SKIP


def test_a_compile_fallback_fails_with_the_reason(
    demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """doctor builds what `serve` would (settings.compile): an inductor that cannot build
    leaves the step on the eager forward, which the check names with the compiler's reason."""

    def cannot_build(*args: object, **kwargs: object) -> object:
        raise RuntimeError("C++ compile failed: g++ not found\ndetail")

    monkeypatch.setattr(precompiled, "precompile", cannot_build)
    options = DoctorOptions(
        model_path=demo_model_dir("llama"), device="cpu", compile="on", compile_cache_dir=tmp_path
    )
    (fast,) = [r for r in run_checks(options) if r.name == NAME]
    assert fast.status == FAIL
    assert fast.detail == (
        "the compiled decode step fell back to the eager forward: "
        "RuntimeError: C++ compile failed: g++ not found"
    )
    assert "C++ compiler" in fast.fix and "--compile off" in fast.fix
