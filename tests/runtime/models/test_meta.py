"""`meta_build` skips parameter init on meta tensors only, and an engine built with compile off
never imports torch._dynamo (checked in a fresh interpreter: pytest's own imports would hide it)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from runtime.models.meta import meta_build

ROOT = Path(__file__).resolve().parents[3]


def test_modules_are_built_on_meta() -> None:
    with meta_build():
        emb, linear = nn.Embedding(8, 4, padding_idx=0), nn.Linear(4, 4)
        nn.init.trunc_normal_(linear.weight)  # an init that does not dispatch itself
    assert emb.weight.is_meta and linear.weight.is_meta and linear.bias.is_meta
    assert emb.weight.shape == (8, 4) and linear.weight.shape == (4, 4)


def test_tensors_off_meta_are_still_initialized() -> None:
    with meta_build():
        cpu = torch.zeros(64, device="cpu")
        nn.init.normal_(cpu)
        filled = torch.zeros(64, device="cpu").uniform_(1.0, 2.0)
    assert cpu.abs().sum() > 0
    assert bool(((filled >= 1.0) & (filled < 2.0)).all())


def test_an_uncompiled_engine_does_not_import_dynamo(
    demo_model_dir: Callable[[str], Path],
) -> None:
    code = f"""
import sys
from pathlib import Path
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.stats import FanOut
config = EngineConfig(
    model_path=Path({str(demo_model_dir("llama"))!r}), model_name="m", device="cpu",
    num_threads=1, compile="auto",  # serve's default: uncompiled on CPU
)
engine = Engine(config, sink=FanOut())
engine.load()
engine.shutdown()
print(sorted(m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout
