"""The decoder layer shared by the llama and gemma families: one module, one forward, used for
prefill and decode alike (and compiled / captured per batch bucket by runtime.models.fast).

A layer is the fused sequence, on the whole packed batch [T, H] at once:

    q, k, v = attn_in(x, cos, sin)          # RMSNorm, one QKV GEMM, q and k rotated in one call
    attn    = attn.attend(q, k, v, plan)    # KV write + one attention call over every sequence's
                                            # pages (runtime.models.batch_plan.attend)
    x       = attn_out_mlp(x, attn)         # o_proj with the residual add inside the GEMM,
                                            # RMSNorm, one gate/up GEMM, the gated activation,
                                            # down_proj + residual in one GEMM; x in place

Q/K/V and gate/up are fused into one projection each (the loader concatenates the HF tensors);
rotary rows come from the model's `RopeTable`. The residual adds folded into the GEMMs
(`Linear.add_to_`, `addmm_`) leave no [T, H] temporaries. Ops are looked up on
`runtime.models.ops` at call time, so a probe or a patched kernel there is what this runs.
The plain fp32 reference of the same layer is runtime.verify.reference (the verification path).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from runtime.models import batch_plan, ops
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
        if x.dim() == 2:  # the packed [T, H] of every forward: mm, not matmul's dispatch
            if self.bias is None:
                return torch.mm(x, self.weight_t)
            return torch.addmm(self.bias, x, self.weight_t)
        if self.bias is None:
            return torch.matmul(x, self.weight_t)
        return torch.matmul(x, self.weight_t) + self.bias

    def add_to_(self, out: Tensor, x: Tensor) -> Tensor:
        """out [T, out_features] += self(x [T, in_features]), in place: the residual add done by
        the GEMM itself (beta = 1), no temporary. A replacement projection (e.g. quantized) that
        cannot accumulate may implement this as `out.add_(self(x))`."""
        out.addmm_(x, self.weight_t)
        if self.bias is not None:
            out.add_(self.bias)
        return out


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int) -> None:
        super().__init__()
        self.args = args
        self.layer_idx = layer_idx
        self.qkv_proj = Linear(args.hidden_size, args.q_size + 2 * args.kv_size, args.qkv_bias)
        self.o_proj = Linear(args.q_size, args.hidden_size, bias=args.o_bias)

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [T, H] normed -> rotated q [T, Hq, D], k [T, Hkv, D] and v [T, Hkv, D] (views of
        one GEMM's output)."""
        a, num_tokens = self.args, x.shape[0]
        qkv = self.qkv_proj(x)  # [T, q_size + 2 * kv_size]
        qk_size = a.q_size + a.kv_size
        # q and k are adjacent columns of qkv: one rotary over all their heads
        qk = qkv[:, :qk_size].view(num_tokens, a.num_heads + a.num_kv_heads, a.head_dim)
        q, k = ops.rotary(qk, cos, sin).split([a.num_heads, a.num_kv_heads], dim=1)
        return q, k, qkv[:, qk_size:].view(num_tokens, a.num_kv_heads, a.head_dim)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, plan: BatchPlan) -> Tensor:
        """The attention core: q [T, Hq, D], k/v [T, Hkv, D] rotated -> [T, q_size] (before
        o_proj). Stores the new tokens' K/V in their pages first (models.batch_plan.attend).
        Never captured or compiled: its shapes change every step (runtime.models.fast)."""
        out = batch_plan.attend(plan, self.layer_idx, q, k, v)  # [T, num_heads, head_dim]
        return out.reshape(q.shape[0], self.args.q_size)


class GatedMLP(nn.Module):
    def __init__(self, args: ModelArgs, act: str) -> None:
        super().__init__()
        self.act = act  # name of the ops function: "swiglu" | "geglu"
        self.inter = args.intermediate_size
        self.gate_up_proj = Linear(args.hidden_size, 2 * self.inter, bias=args.mlp_bias)
        self.down_proj = Linear(self.inter, args.hidden_size, bias=args.mlp_bias)

    def add_to_(self, out: Tensor, x: Tensor) -> Tensor:
        """out [T, H] += mlp(x [T, H] normed), in place (down_proj accumulates into out)."""
        gate_up = self.gate_up_proj(x)  # [T, 2 * inter]
        act = getattr(ops, self.act)(gate_up[:, : self.inter], gate_up[:, self.inter :])
        return self.down_proj.add_to_(out, act)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int, norm_offset: float, act: str) -> None:
        super().__init__()
        self.input_norm = RMSNorm(args.hidden_size, args.norm_eps, norm_offset)
        self.attn = Attention(args, layer_idx)
        self.post_attn_norm = RMSNorm(args.hidden_size, args.norm_eps, norm_offset)
        self.mlp = GatedMLP(args, act)

    def forward(self, x: Tensor, plan: BatchPlan, cos: Tensor, sin: Tensor) -> Tensor:
        """x [T, H] residual stream (updated in place and returned); cos/sin [T, 1, D] rows of
        the model's RopeTable. Writes the new tokens' K/V into their pages."""
        q, k, v = self.attn_in(x, cos, sin)
        return self.attn_out_mlp(x, self.attn.attend(q, k, v, plan))

    # The two halves around the attention core: what runtime.models.fast compiles (compile=on)
    # and captures per batch bucket on CUDA. Called through the instance, so a compiled half
    # set on the instance is what `forward` runs too.
    def attn_in(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.attn.qkv(self.input_norm(x), cos, sin)

    def attn_out_mlp(self, x: Tensor, attn: Tensor) -> Tensor:
        """x [T, H] += o_proj(attn [T, q_size]); then x += mlp(norm(x)). In place."""
        self.attn.o_proj.add_to_(x, attn)
        return self.mlp.add_to_(x, self.post_attn_norm(x))
