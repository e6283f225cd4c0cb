"""Per-op probes: the fast op and its reference, run on the same inputs, summarised as one
scalar pair (output, expected) for `inference_log`.

Inputs are one layer's tensors captured by the (packed) reference forward, cast to the serving
dtype on the serving device, so the fast kernel that runs is the one production runs (a bf16 CUDA
kernel for a bf16 CUDA model). The fast op is looked up in `runtime.models.ops` at call time: a
patched or broken kernel there is what gets probed. The reference op gets the same low-precision
inputs (it computes in fp32 and rounds its result to the input dtype), so only the op itself
differs.

The scalar summary, per request, is the element of largest deviation over that request's part of
the tensor, in units of the reference's scale there, `s = max(1, max|ref|)`: output = fast[i] / s,
expected = ref[i] / s, i = argmax |fast - ref|. So ABS(output - expected) in the audit is the op's
worst error over its part of the tensor (a single corrupted element shows; a sum could cancel and
would grow with the tensor size), absolute for activations within [-1, 1] and relative to the
largest value beyond (large MLP activations in bf16 carry an absolute rounding error of ~|x| / 256
that is no fault). NaN in the fast output counts as the worst deviation and is stored as +inf
(storage.rows).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from runtime.models import ops
from runtime.verify.reference import OpInputs

Probe = tuple[str, float, float]  # (op, output, expected)
Span = tuple[int, int]  # [start, end) rows of one sequence in a packed tensor


def _scale(values: list[float]) -> float:
    return max([1.0, *(v for v in values if math.isfinite(v))])


def deviation(fast: Tensor, ref: Tensor) -> tuple[float, float]:
    """(fast[i] / s, ref[i] / s) at the element of largest |fast - ref|; see the module doc."""
    (pair,) = row_deviations(fast.reshape(1, -1), ref.reshape(1, -1), [(0, 1)])
    return pair


def row_deviations(fast: Tensor, ref: Tensor, spans: list[Span]) -> list[tuple[float, float]]:
    """`deviation` of each sequence's rows of packed [T, ...] tensors, with one host transfer
    for the row maxima and one for the picked elements."""
    num_rows = fast.shape[0]
    f = fast.detach().float().reshape(num_rows, -1)
    r = ref.detach().float().reshape(num_rows, -1)
    row_err, row_col = (f - r).abs().nan_to_num(nan=math.inf).max(dim=1)  # [T] each
    errs, cols, scales = row_err.tolist(), row_col.tolist(), r.abs().amax(dim=1).tolist()
    rows = [max(range(start, end), key=errs.__getitem__) for start, end in spans]
    picked_rows = torch.tensor(rows, device=f.device)
    picked_cols = torch.tensor([cols[row] for row in rows], device=f.device)
    outputs, expected = f[picked_rows, picked_cols].tolist(), r[picked_rows, picked_cols].tolist()
    return [
        (out / scale, exp / scale)
        for out, exp, scale in zip(
            outputs, expected, [_scale(scales[start:end]) for start, end in spans], strict=True
        )
    ]


def _attention(q: Tensor, k: Tensor, v: Tensor) -> tuple[float, float]:
    """One sequence: q [Hq, n, D], k/v [Hkv, n, D]. The per-sequence op has three paths (prefill
    from 0, a chunk with a cached past, one-token decode), and production runs several sequences
    through the batched op (`masked_attention`); each runs against the matching rows of the
    reference (query i's causal result does not depend on how the prompt was chunked)."""
    n = q.shape[1]
    ref = ops.attention_ref(q, k, v, causal_offset=0)  # [Hq, n, D]
    fast, expected = [_batched_attention(q, k, v)], [ref]
    for start in sorted({0, n // 2, n - 1}):  # causal offsets: prefill, chunk, decode
        fast.append(ops.attention(q[:, start:], k, v, causal_offset=start))
        expected.append(ref[:, start:])
    return deviation(torch.cat(fast, dim=1), torch.cat(expected, dim=1))


def _batched_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The sequence as the one row of a padded batch, laid out as runtime.models.batch_plan.attend
    lays out a prefill row: a kv head's query heads folded with the queries, a causal mask."""
    num_heads, n, head_dim = q.shape
    num_kv_heads = k.shape[0]
    group = num_heads // num_kv_heads
    rows = q.view(num_kv_heads, group, n, head_dim).transpose(1, 2)  # [Hkv, n, group, D]
    rows = rows.reshape(1, num_kv_heads, n * group, head_dim)
    positions = torch.arange(n, device=q.device)
    allowed = positions[None, :] <= positions[:, None]  # [n queries, n keys]
    mask = allowed[:, None, :].expand(n, group, n).reshape(1, 1, n * group, n)
    out = ops.masked_attention(rows, k[None], v[None], mask)  # [1, Hkv, n * group, D]
    return out.view(num_kv_heads, n, group, head_dim).transpose(1, 2).reshape(q.shape)


@torch.inference_mode()
def probe_ops(inputs: OpInputs, dtype: torch.dtype) -> list[list[Probe]]:
    """Per sequence: one probe per op (rms_norm, rotary, attention, the gated activation)."""
    spans = inputs.spans()
    x = inputs.norm_x.to(dtype)
    w, eps, offset = inputs.norm_weight, inputs.norm_eps, inputs.norm_offset
    norm = row_deviations(
        ops.rms_norm(x, w, eps, offset=offset), ops.rms_norm_ref(x, w, eps, offset=offset), spans
    )

    q, k = inputs.q.to(dtype), inputs.k.to(dtype)
    pos, theta, head_dim = inputs.positions, inputs.rope_theta, inputs.head_dim
    fq, fk = ops.apply_rotary(q, k, pos, theta, head_dim)
    rq, rk = ops.rotary_ref(q, k, pos, theta, head_dim)
    num_rows = q.shape[0]
    fast_rot = torch.cat((fq.reshape(num_rows, -1), fk.reshape(num_rows, -1)), dim=1)
    ref_rot = torch.cat((rq.reshape(num_rows, -1), rk.reshape(num_rows, -1)), dim=1)
    rotary = row_deviations(fast_rot, ref_rot, spans)

    # attention on the inputs it had on the reference path: [T, H, D] -> per sequence [H, n, D]
    heads = [
        t.to(dtype).transpose(0, 1).split(inputs.lengths, dim=1)
        for t in (inputs.q_rot, inputs.k_rot, inputs.v)
    ]
    attention = [_attention(*qkv) for qkv in zip(*heads, strict=True)]

    gate, up = inputs.gate.to(dtype), inputs.up.to(dtype)
    fast_act = getattr(ops, inputs.act)(gate, up)
    act = row_deviations(fast_act, getattr(ops, f"{inputs.act}_ref")(gate, up), spans)
    return [
        [("rms_norm", *n), ("rotary", *r), ("attention", *a), (inputs.act, *g)]
        for n, r, a, g in zip(norm, rotary, attention, act, strict=True)
    ]
