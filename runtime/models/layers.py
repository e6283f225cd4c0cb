"""Decoder blocks shared by the llama and gemma families.

Linear layers run on the whole packed batch [T, H] at once (one matmul for all sequences), and so
does attention: one call per layer over every sequence's pages (runtime.models.paged_attention).
Q/K/V and gate/up are fused into one projection each (the loader concatenates the HF tensors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from runtime.models import ops, paged_attention
from runtime.models.config import ModelArgs

if TYPE_CHECKING:
    from runtime.models.batch_plan import BatchPlan


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, offset: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps
        self.offset = offset  # gemma stores w and scales by (1 + w)

    def forward(self, x: Tensor) -> Tensor:
        return ops.rms_norm(x, self.weight, self.eps, offset=self.offset)


class Linear(nn.Module):
    """y = x W^T (+ b), with W kept transposed: `weight_t` is [in, out], contiguous.

    Why: on CPU (MKL), torch's fp32 GEMM runs `x @ W_t` much faster than `x @ W^T` (nn.Linear's
    layout) when x has one or two rows, i.e. when decoding a few sequences. Measured on the
    project's 2-core dev machine over one forward's GEMMs of the `small` llama: 1 row 14-15 ms vs
    22-24 ms, 2 rows 24 vs 43; from 8 rows on the two are equal within noise. The checkpoint's
    [out, in] tensor is transposed once at load (a load_state_dict pre-hook), so checkpoints and
    state-dict names are unchanged; `weight` is the [out, in] view the reference paths read."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight_t = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self._register_load_state_dict_pre_hook(self._transpose_on_load)

    @staticmethod
    def _transpose_on_load(state: dict, prefix: str, *_: object) -> None:
        weight = state.pop(prefix + "weight", None)
        if weight is not None:
            state[prefix + "weight_t"] = weight.t().contiguous()

    @property
    def weight(self) -> Tensor:
        return self.weight_t.t()

    def forward(self, x: Tensor) -> Tensor:
        if self.bias is None:
            return torch.matmul(x, self.weight_t)
        if x.dim() == 2:
            return torch.addmm(self.bias, x, self.weight_t)
        return torch.matmul(x, self.weight_t) + self.bias


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int) -> None:
        super().__init__()
        self.args = args
        self.layer_idx = layer_idx
        self.qkv_proj = Linear(args.hidden_size, args.q_size + 2 * args.kv_size, args.qkv_bias)
        self.o_proj = Linear(args.q_size, args.hidden_size, bias=args.o_bias)

    def forward(self, x: Tensor, plan: BatchPlan, cos_sin: tuple[Tensor, Tensor]) -> Tensor:
        """x [T, H] packed -> [T, H]. Stores the new tokens' K/V in each sequence's cache."""
        a = self.args
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([a.q_size, a.kv_size, a.kv_size], dim=-1)
        q = q.view(num_tokens, a.num_heads, a.head_dim)
        k = k.view(num_tokens, a.num_kv_heads, a.head_dim)
        v = v.view(num_tokens, a.num_kv_heads, a.head_dim)
        q, k = ops.apply_rotary(q, k, plan.positions, a.rope_theta, a.head_dim, cos_sin=cos_sin)
        return self.o_proj(self.attend(q, k, v, plan))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, plan: BatchPlan) -> Tensor:
        """The attention core, shared by the eager forward and the fast decode path
        (runtime.models.fast): q [T, Hq, D], k/v [T, Hkv, D] rotated -> [T, q_size] (before
        o_proj). Stores the new tokens' K/V in their pages first (models.paged_attention)."""
        out = paged_attention.attend(plan, self.layer_idx, q, k, v)  # [T, num_heads, head_dim]
        return out.reshape(q.shape[0], self.args.q_size)


class GatedMLP(nn.Module):
    def __init__(self, args: ModelArgs, act: str) -> None:
        super().__init__()
        self.act = act  # name of the ops function: "swiglu" | "geglu"
        self.inter = args.intermediate_size
        self.gate_up_proj = Linear(args.hidden_size, 2 * self.inter, bias=args.mlp_bias)
        self.down_proj = Linear(self.inter, args.hidden_size, bias=args.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).split([self.inter, self.inter], dim=-1)
        return self.down_proj(getattr(ops, self.act)(gate, up))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int, norm_offset: float, act: str) -> None:
        super().__init__()
        self.input_norm = RMSNorm(args.hidden_size, args.norm_eps, norm_offset)
        self.attn = Attention(args, layer_idx)
        self.post_attn_norm = RMSNorm(args.hidden_size, args.norm_eps, norm_offset)
        self.mlp = GatedMLP(args, act)

    def forward(self, x: Tensor, plan: BatchPlan, cos_sin: tuple[Tensor, Tensor]) -> Tensor:
        h = x + self.attn(self.input_norm(x), plan, cos_sin)
        return h + self.mlp(self.post_attn_norm(h))
