"""The model ops: each fast op has a plain reference implementation beside it.

Models call these through the module (`from runtime.models import ops; ops.geglu(...)`), never by
importing the function, so a test or the verification path can swap one op (e.g. monkeypatch
`runtime.models.ops.geglu` with a faulty kernel) and every model picks it up.
Reference ops compute in float32 with explicit formulas and return the input dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def rms_norm(x: Tensor, weight: Tensor, eps: float, *, offset: float = 0.0) -> Tensor:
    """x [..., H] normalised by its RMS, scaled by (offset + weight); gemma uses offset=1.0.
    Matches HF: llama casts before the weight multiply, gemma after (both compute in fp32).
    On CPU in fp32 it is HF's formula written out: `F.rms_norm` there is a composite that copies
    its input twice and dispatches ~12 ops (27.8 vs 20.1 us of CPU per [1, 512] row, measured)."""
    if x.dtype == torch.float32:
        w = weight if offset == 0.0 else weight.float() + offset
        if x.device.type == "cpu":
            return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    normed = F.rms_norm(x.float(), (x.shape[-1],), None, eps)
    if offset == 0.0:
        return weight * normed.to(x.dtype)
    return (normed * (weight.float() + offset)).to(x.dtype)


def rms_norm_ref(x: Tensor, weight: Tensor, eps: float, *, offset: float = 0.0) -> Tensor:
    xf = x.float()
    normed = xf / torch.sqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed * (weight.float() + offset)).to(x.dtype)


def rope_cos_sin(positions: Tensor, theta: float, head_dim: int, dtype: torch.dtype):
    """positions [T] -> (cos, sin), each [T, 1, head_dim] in `dtype` (fp32 math, as HF does).
    `sin` carries rotate_half's sign (its first half negated): the form `rotary` takes."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device)
    inv_freq = 1.0 / (theta ** (exponents / head_dim))  # [head_dim / 2]
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, head_dim]
    sin = emb.sin()
    sin[..., : head_dim // 2].neg_()
    return emb.cos().to(dtype), sin.to(dtype)


def rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [T, heads, D] (any heads: q and k may go through together) rotated in the half-split
    (HF) layout: x * cos + rotate_half(x) * sin, with rotate_half's sign folded into `sin` (from
    `rope_cos_sin` or a `RopeTable`), so its swap of the halves is one `flip`: three ops where HF
    has seven (a flip costs 4.1 us of CPU on a [1, 12, 64] view, roll 6.2, cat 9.4, measured)."""
    halves = x.unflatten(-1, (2, x.shape[-1] // 2))  # [..., 2, D/2]
    return torch.addcmul(x * cos, halves.flip(-2).flatten(-2), sin)


def apply_rotary(
    q: Tensor,
    k: Tensor,
    positions: Tensor,
    theta: float,
    head_dim: int,
    *,
    cos_sin: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """q [T, Hq, D], k [T, Hkv, D], positions [T] -> rotated (q, k) in the half-split (HF) layout.
    `cos_sin` from `rope_cos_sin` lets a model compute the tables once per forward."""
    cos, sin = cos_sin if cos_sin is not None else rope_cos_sin(positions, theta, head_dim, q.dtype)
    return rotary(q, cos, sin), rotary(k, cos, sin)


def rotary_ref(
    q: Tensor, k: Tensor, positions: Tensor, theta: float, head_dim: int, **_: object
) -> tuple[Tensor, Tensor]:
    """Pairs (i, i + D/2) rotated by angle pos * theta^(-2i/D), written out in float64."""
    half = head_dim // 2
    i = torch.arange(half, dtype=torch.float64, device=q.device)
    angle = positions.double()[:, None, None] * theta ** (-2.0 * i / head_dim)  # [T, 1, D/2]
    c, s = torch.cos(angle), torch.sin(angle)

    def rot(x: Tensor) -> Tensor:
        x1, x2 = x.double()[..., :half], x.double()[..., half:]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)

    return rot(q), rot(k)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    return F.silu(gate) * up


def swiglu_ref(gate: Tensor, up: Tensor) -> Tensor:
    g = gate.float()
    return (g / (1.0 + torch.exp(-g)) * up.float()).to(gate.dtype)


def geglu(gate: Tensor, up: Tensor) -> Tensor:
    return F.gelu(gate, approximate="tanh") * up


def geglu_ref(gate: Tensor, up: Tensor) -> Tensor:
    g = gate.float()
    inner = math.sqrt(2.0 / math.pi) * (g + 0.044715 * g.pow(3))
    return (0.5 * g * (1.0 + torch.tanh(inner)) * up.float()).to(gate.dtype)


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal_offset: int) -> Tensor:
    """One sequence. q [Hq, n, D]; k, v [Hkv, L, D] with L = causal_offset + n (its cached past
    plus the new tokens); query i sits at position causal_offset + i. -> [Hq, n, D]."""
    num_heads, n, head_dim = q.shape
    num_kv_heads, total, _ = k.shape
    group = num_heads // num_kv_heads
    k4, v4 = k[None], v[None]  # 4-D inputs: what the fused CUDA kernels accept
    if n == 1:
        # Decode: fold the query heads of one kv head into rows; no mask, no K/V expansion.
        q4 = q.reshape(1, num_kv_heads, group, head_dim)
        return F.scaled_dot_product_attention(q4, k4, v4).reshape(num_heads, 1, head_dim)
    gqa = group > 1
    if causal_offset == 0:
        return F.scaled_dot_product_attention(q[None], k4, v4, is_causal=True, enable_gqa=gqa)[0]
    query_pos = torch.arange(n, device=q.device)[:, None] + causal_offset
    mask = torch.arange(total, device=q.device)[None, :] <= query_pos  # [n, L]
    return F.scaled_dot_product_attention(q[None], k4, v4, attn_mask=mask, enable_gqa=gqa)[0]


def attention_ref(q: Tensor, k: Tensor, v: Tensor, *, causal_offset: int) -> Tensor:
    num_heads, n, head_dim = q.shape
    group = num_heads // k.shape[0]
    kf = k.float().repeat_interleave(group, dim=0)  # [Hq, L, D]
    vf = v.float().repeat_interleave(group, dim=0)
    scores = q.float() @ kf.transpose(1, 2) / math.sqrt(head_dim)  # [Hq, n, L]
    query_pos = torch.arange(n, device=q.device)[:, None] + causal_offset
    allowed = torch.arange(k.shape[1], device=q.device)[None, :] <= query_pos
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vf).to(q.dtype)


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """A padded batch of rows (runtime.models.batch_plan.attend). q [R, Hkv, M, D]; k, v
    [R, Hkv, L, D] (any strides); mask [R, 1, M or 1, L] bool, True = attend, at least one True
    per query row. -> [R, Hkv, M, D]. M folds the query heads of a kv head with the row's
    queries, so no K/V expansion."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def masked_attention_ref(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])  # [R, Hkv, M, L]
    scores = scores.masked_fill(~mask, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v.float()).to(q.dtype)
