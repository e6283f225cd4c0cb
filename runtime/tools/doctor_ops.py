"""The operator self-test of `fastllm doctor`: every fast op in runtime.models.ops against its
reference on the device in use, on random inputs shaped like a small model's.

Ops are looked up on the module at call time (`getattr(ops, name)`), like the models do, so a
replaced (e.g. monkeypatched, or miscompiled) kernel is what gets tested.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from runtime.models import ops


@dataclass(frozen=True)
class OpCheck:
    name: str  # "<op> vs <op_ref> (<case>)"
    op: str
    max_abs_error: float
    scale: float  # max |reference|: the error is judged relative to it
    tolerance: float

    @property
    def is_ok(self) -> bool:
        error = self.max_abs_error
        return error == error and error <= self.tolerance * max(1.0, self.scale)  # NaN fails


def _cases(
    device: torch.device, gen: torch.Generator
) -> list[tuple[str, str, str, Callable[[], Any]]]:
    """(op, reference, case label, inputs -> (args, kwargs)) rows."""

    def rand(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, device="cpu").to(device)

    t, h, hq, hkv, d = 7, 64, 4, 2, 16
    positions = torch.arange(3, 3 + t, device=device)
    return [
        ("rms_norm", "rms_norm_ref", "llama", lambda: ((rand(t, h), rand(h), 1e-6), {})),
        (
            "rms_norm",
            "rms_norm_ref",
            "gemma offset=1",
            lambda: ((rand(t, h), rand(h), 1e-6), {"offset": 1.0}),
        ),
        (
            "apply_rotary",
            "rotary_ref",
            "prefill",
            lambda: ((rand(t, hq, d), rand(t, hkv, d), positions, 10000.0, d), {}),
        ),
        ("swiglu", "swiglu_ref", "", lambda: ((rand(t, 3 * h), rand(t, 3 * h)), {})),
        ("geglu", "geglu_ref", "", lambda: ((rand(t, 3 * h), rand(t, 3 * h)), {})),
        (
            "attention",
            "attention_ref",
            "prefill",
            lambda: ((rand(hq, t, d), rand(hkv, t, d), rand(hkv, t, d)), {"causal_offset": 0}),
        ),
        (
            "attention",
            "attention_ref",
            "chunk after 5 cached",
            lambda: ((rand(hq, 3, d), rand(hkv, 8, d), rand(hkv, 8, d)), {"causal_offset": 5}),
        ),
        (
            "attention",
            "attention_ref",
            "decode",
            lambda: ((rand(hq, 1, d), rand(hkv, 9, d), rand(hkv, 9, d)), {"causal_offset": 8}),
        ),
    ]


def _max_error(out: Any, ref: Any) -> tuple[float, float]:
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    error = max(
        float((o.double() - r.double()).abs().max()) for o, r in zip(outs, refs, strict=True)
    )
    scale = max(float(r.double().abs().max()) for r in refs)
    return error, scale


def self_test_ops(device: torch.device, *, seed: int = 0) -> list[OpCheck]:
    """Each op on float32 inputs vs its reference; CUDA kernels get a looser tolerance."""
    tolerance = 1e-4 if device.type == "cpu" else 2e-3
    gen = torch.Generator().manual_seed(seed)
    checks = []
    for op, ref_name, case, make in _cases(device, gen):
        args, kwargs = make()
        with torch.no_grad():
            try:
                out = getattr(ops, op)(*args, **kwargs)
                error, scale = _max_error(out, getattr(ops, ref_name)(*args, **kwargs))
            except Exception:  # a kernel that raises fails its check
                error, scale = float("inf"), 0.0
        label = f"{op} vs {ref_name}" + (f" ({case})" if case else "")
        checks.append(OpCheck(label, op, error, scale, tolerance))
    return checks
