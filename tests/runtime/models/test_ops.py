"""Fast ops agree with their plain references; models pick ops up through the module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runtime.models import load_model, ops
from tests.runtime.models.builders import build_gemma, build_llama
from tests.runtime.models.paged import Pages

gen = torch.Generator().manual_seed(0)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm(offset: float, dtype: torch.dtype) -> None:
    x, w = randn(5, 64).to(dtype), randn(64).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    got = ops.rms_norm(x, w, 1e-6, offset=offset)
    assert got.dtype == dtype
    torch.testing.assert_close(got, ops.rms_norm_ref(x, w, 1e-6, offset=offset), atol=tol, rtol=tol)


def test_rms_norm_offset_means_one_plus_w() -> None:
    x, w = randn(3, 16), randn(16)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6, offset=1.0), ops.rms_norm(x, w + 1, 1e-6))


def test_rotary_matches_reference_and_preserves_norm() -> None:
    q, k, pos = randn(7, 4, 32), randn(7, 2, 32), torch.tensor([0, 1, 2, 3, 50, 51, 4000])
    got = ops.apply_rotary(q, k, pos, 500000.0, 32)
    ref = ops.rotary_ref(q, k, pos, 500000.0, 32)
    for a, b in zip(got, ref, strict=True):
        # fp32 angles (as HF computes them) drift ~pos * 6e-8 rad from the float64 reference
        torch.testing.assert_close(a[:4], b[:4], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a, b, atol=1e-3, rtol=0)
    torch.testing.assert_close(got[0].norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(got[0][0], q[0])  # position 0 is the identity


def test_rotary_precomputed_tables_give_the_same_result() -> None:
    q, k, pos = randn(3, 2, 8), randn(3, 2, 8), torch.tensor([5, 6, 7])
    tables = ops.rope_cos_sin(pos, 10000.0, 8, torch.float32)
    plain = ops.apply_rotary(q, k, pos, 10000.0, 8)
    cached = ops.apply_rotary(q, k, pos, 10000.0, 8, cos_sin=tables)
    assert all(torch.equal(a, b) for a, b in zip(plain, cached, strict=True))


def test_gated_activations() -> None:
    gate, up = randn(4, 32), randn(4, 32)
    torch.testing.assert_close(ops.swiglu(gate, up), ops.swiglu_ref(gate, up))
    torch.testing.assert_close(ops.geglu(gate, up), ops.geglu_ref(gate, up))
    assert not torch.allclose(ops.geglu(gate, up), F.gelu(gate) * up, atol=1e-6)  # tanh, not erf


@pytest.mark.parametrize(("n", "past"), [(1, 0), (1, 9), (6, 0), (4, 5)])
@pytest.mark.parametrize("kv_heads", [1, 2, 8])
def test_attention_paths_match_reference(n: int, past: int, kv_heads: int) -> None:
    q, k, v = randn(8, n, 16), randn(kv_heads, past + n, 16), randn(kv_heads, past + n, 16)
    got = ops.attention(q, k, v, causal_offset=past)
    assert got.shape == (8, n, 16)
    torch.testing.assert_close(
        got, ops.attention_ref(q, k, v, causal_offset=past), atol=1e-5, rtol=1e-5
    )


def run(model, tokens: list[int]) -> torch.Tensor:
    pages = Pages(model)
    (logits,) = pages.step([(pages.new(), tokens)])
    return logits


@pytest.mark.parametrize(
    ("builder", "op"), [(build_gemma, "geglu"), (build_llama, "swiglu"), (build_llama, "attention")]
)
def test_models_call_ops_through_the_module(
    builder, op: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_model(builder(tmp_path / "m", tokenizer=False), load_tokenizer=False).model
    tokens = [3, 9, 27, 81]
    clean = run(model, tokens)
    ref_op = getattr(ops, f"{op}_ref")
    monkeypatch.setattr(ops, op, ref_op)  # the reference kernel: same numbers
    torch.testing.assert_close(run(model, tokens), clean, atol=1e-4, rtol=0)
    monkeypatch.setattr(ops, op, lambda *a, **kw: ref_op(*a, **kw) * 1.5)  # a faulty kernel
    assert (run(model, tokens) - clean).abs().max() > 1e-3  # 10x the parity tolerance
