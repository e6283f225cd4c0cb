"""The fused pieces of a decoder layer, as plain functions of tensors.

A layer is two pieces around the attention core (which stays the model's own,
`Attention.attend`, owned by the KV/attention work):

    q, k, v = attn_in(dims, w, x, cos, sin)      # RMSNorm, one QKV GEMM, q and k rotated together
    attn    = layer.attn.attend(q, k, v, plan)   # KV write + SDPA per sequence (not a piece)
    x       = attn_out_mlp(dims, w, x, attn)     # o_proj + residual in one GEMM, RMSNorm,
                                                 # one gate/up GEMM, the gated activation,
                                                 # down_proj + residual in one GEMM; x in place

Against the eager module forward this drops the per-forward rotary tables (a `RopeTable`
lookup instead), rotates q and k in one `ops.rotary` (3 ops, not 14), folds both residual adds
into their GEMMs (`addmm_`, no [T, H] temporaries) and skips the split/view bookkeeping of the
modules. Ops are still looked up on `runtime.models.ops` at call time, so a probe or a patched
kernel there sees the kernel this path runs. Weights are the model's own parameters (no copy).
Being pure functions of tensors, the pieces can be compiled once and reused by every layer,
and captured per batch-size bucket on CUDA (`runtime.models.fast.graphs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from runtime.models import ops
from runtime.models.base import CausalLM
from runtime.models.layers import DecoderLayer


@dataclass(frozen=True)
class DecodeDims:
    q_size: int  # num_heads * head_dim
    kv_size: int  # num_kv_heads * head_dim
    num_heads: int
    num_kv_heads: int
    head_dim: int
    inter: int  # intermediate size: gate_up is [T, 2 * inter]
    eps: float
    norm_offset: float  # gemma scales by (1 + w)
    act: str  # name of the gated activation in `ops`

    @property
    def group(self) -> int:
        """Query heads per kv head (the paged attention plan folds them into query rows)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def of(cls, model: CausalLM) -> DecodeDims:
        a = model.args
        return cls(
            q_size=a.q_size,
            kv_size=a.kv_size,
            num_heads=a.num_heads,
            num_kv_heads=a.num_kv_heads,
            head_dim=a.head_dim,
            inter=a.intermediate_size,
            eps=a.norm_eps,
            norm_offset=model.norm_offset,
            act=model.mlp_act,
        )


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's parameters, the model's own tensors ([in, out] GEMM layout)."""

    input_norm: Tensor  # [H]
    qkv_t: Tensor  # [H, q_size + 2 * kv_size]
    qkv_b: Tensor | None
    o_t: Tensor  # [q_size, H]
    o_b: Tensor | None
    post_norm: Tensor  # [H]
    gate_up_t: Tensor  # [H, 2 * inter]
    gate_up_b: Tensor | None
    down_t: Tensor  # [inter, H]
    down_b: Tensor | None

    @classmethod
    def of_model(cls, model: CausalLM) -> list[LayerWeights]:
        out = []
        for module in model.layers:
            layer = cast(DecoderLayer, module)
            attn, mlp = layer.attn, layer.mlp
            out.append(
                cls(
                    input_norm=layer.input_norm.weight,
                    qkv_t=attn.qkv_proj.weight_t,
                    qkv_b=attn.qkv_proj.bias,
                    o_t=attn.o_proj.weight_t,
                    o_b=attn.o_proj.bias,
                    post_norm=layer.post_attn_norm.weight,
                    gate_up_t=mlp.gate_up_proj.weight_t,
                    gate_up_b=mlp.gate_up_proj.bias,
                    down_t=mlp.down_proj.weight_t,
                    down_b=mlp.down_proj.bias,
                )
            )
        return out


def _project(x: Tensor, weight_t: Tensor, bias: Tensor | None) -> Tensor:
    return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)


def _add_project_(x: Tensor, inp: Tensor, weight_t: Tensor, bias: Tensor | None) -> None:
    """x += inp @ weight_t (+ bias): the residual add done by the GEMM itself (beta = 1)."""
    x.addmm_(inp, weight_t)
    if bias is not None:
        x.add_(bias)


def attn_in(
    dims: DecodeDims, w: LayerWeights, x: Tensor, cos: Tensor, sin: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """x [T, H] residual stream -> rotated q [T, Hq, D], k [T, Hkv, D] and v [T, Hkv, D]."""
    num_tokens, d = x.shape[0], dims.head_dim
    normed = ops.rms_norm(x, w.input_norm, dims.eps, offset=dims.norm_offset)
    qkv = _project(normed, w.qkv_t, w.qkv_b)  # [T, q_size + 2 * kv_size]
    qk_size = dims.q_size + dims.kv_size
    # q and k are adjacent columns of qkv: one rotary over all their heads
    qk = qkv[:, :qk_size].view(num_tokens, dims.num_heads + dims.num_kv_heads, d)
    q, k = ops.rotary(qk, cos, sin).split([dims.num_heads, dims.num_kv_heads], dim=1)
    return q, k, qkv[:, qk_size:].view(num_tokens, dims.num_kv_heads, d)


def attn_out_mlp(dims: DecodeDims, w: LayerWeights, x: Tensor, attn: Tensor) -> Tensor:
    """x [T, H] += o_proj(attn [T, q_size]); then x += mlp(norm(x)). Updates x in place."""
    _add_project_(x, attn, w.o_t, w.o_b)
    normed = ops.rms_norm(x, w.post_norm, dims.eps, offset=dims.norm_offset)
    gate_up = _project(normed, w.gate_up_t, w.gate_up_b)  # [T, 2 * inter]
    act = getattr(ops, dims.act)(gate_up[:, : dims.inter], gate_up[:, dims.inter :])
    _add_project_(x, act, w.down_t, w.down_b)
    return x
