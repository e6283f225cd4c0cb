"""`meta_build` skips parameter init on meta tensors only (tests/runtime/test_lazy_imports.py:
a loaded engine has not imported torch._dynamo)."""

from __future__ import annotations

import torch
from torch import nn

from runtime.models.meta import meta_build


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
