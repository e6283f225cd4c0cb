"""The reference path: whole sequences' forward in float32 with the `*_ref` ops.

It is written out here, independently of the fast path: no KV cache, no batch plan, no SDPA, every
op the explicit reference beside the fast one in `runtime.models.ops`. It reads the production
model's weights and upcasts them on the fly, one layer at a time (a no-op for fp32 weights; for
bf16/fp16 only one layer's fp32 copy lives at once), so it needs no second model.

Why not swap the fast ops for their references with a context manager and rerun the model's own
forward? The engine keeps serving on another thread while this runs; patching the module globals
would put the production requests on the reference ops (and the verifier would then compare the
reference with itself). Reading the weights is thread-safe; patching is not.

Several sequences go through one call packed back to back (`[T, ...]`, T = their total length):
linear layers, norms, rotary and the gated activation act on each token alone, so packing changes
nothing there; attention runs per sequence. While it runs it captures, for one layer, the inputs of
every probed op (`OpInputs`), so the fast and the reference op can then be run on the very same
tensors (`runtime.verify.probes`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from runtime.models import ops
from runtime.models.base import CausalLM
from runtime.models.config import ModelArgs
from runtime.models.layers import DecoderLayer, Linear, RMSNorm
from runtime.models.lora.weights import LoraWeights
from runtime.models.quant import QuantizedLinear


@dataclass
class OpInputs:
    """One layer's op inputs from the reference forward: fp32, on the model's device, packed
    (`lengths[i]` tokens of sequence i, back to back; T = sum(lengths))."""

    layer: int
    act: str  # "geglu" | "swiglu": the model's gated activation
    lengths: list[int]
    norm_x: Tensor  # [T, H] input of the layer's input RMSNorm
    norm_weight: Tensor  # [H] (the model's own parameter, serving dtype)
    norm_eps: float
    norm_offset: float  # gemma scales by (1 + w)
    positions: Tensor  # [T] position of each token within its sequence
    rope_theta: float
    head_dim: int
    q: Tensor  # [T, Hq, D] before rotary
    k: Tensor  # [T, Hkv, D] before rotary
    v: Tensor  # [T, Hkv, D]
    q_rot: Tensor  # [T, Hq, D] after the reference rotary: attention's inputs
    k_rot: Tensor  # [T, Hkv, D]
    gate: Tensor  # [T, I]
    up: Tensor  # [T, I]

    def spans(self) -> list[tuple[int, int]]:
        """[start, end) rows of each sequence."""
        ends = list(itertools.accumulate(self.lengths))
        return [(end - n, end) for n, end in zip(self.lengths, ends, strict=True)]


@dataclass
class ReferenceResult:
    chosen_logits: list[float]  # per sequence: the reference logit of the token production chose
    inputs: OpInputs


def _linear(x: Tensor, layer: Linear) -> Tensor:
    bias = None if layer.bias is None else layer.bias.float()
    return F.linear(x, layer.weight.float(), bias)


def _norm(x: Tensor, norm: RMSNorm, offset: float) -> Tensor:
    return ops.rms_norm_ref(x, norm.weight, norm.eps, offset=offset)


def _lora(
    out: Tensor,
    x: Tensor,
    spans: list[tuple[int, int]],
    adapters: Sequence[LoraWeights | None] | None,
    layer: int,
    fused: str,
) -> Tensor:
    """out [T, o] + each adapted sequence's LoRA delta of projection `fused`, in fp32 (the
    same fused A^T / scaled B^T the production path reads, upcast)."""
    if adapters is None:
        return out
    for (start, end), weights in zip(spans, adapters, strict=True):
        pair = None if weights is None else getattr(weights.layers[layer], fused)
        if pair is not None:
            a_t, b_t = pair
            delta = (x[start:end] @ a_t.float()) @ b_t.float()
            out[start:end] += delta  # `out` is the fresh output of _linear
    return out


def _capture(
    index: int,
    layer: DecoderLayer,
    x: Tensor,
    lengths: list[int],
    positions: Tensor,
    args: ModelArgs,
    qkv: tuple[Tensor, Tensor, Tensor, Tensor, Tensor],
    gate: Tensor,
    up: Tensor,
) -> OpInputs:
    q, k, v, q_rot, k_rot = qkv
    return OpInputs(
        layer=index,
        act=layer.mlp.act,
        lengths=lengths,
        norm_x=x,
        norm_weight=layer.input_norm.weight,
        norm_eps=layer.input_norm.eps,
        norm_offset=layer.input_norm.offset,
        positions=positions,
        rope_theta=args.rope_theta,
        head_dim=args.head_dim,
        q=q,
        k=k,
        v=v,
        q_rot=q_rot,
        k_rot=k_rot,
        gate=gate,
        up=up,
    )


@torch.inference_mode()
def reference_forward(
    model: CausalLM,
    seqs: Sequence[tuple[Sequence[int], int]],
    *,
    capture_layer: int,
    adapters: Sequence[LoraWeights | None] | None = None,
) -> ReferenceResult:
    """`seqs`: (token_ids, chosen_token_id) per sequence, token_ids the full sequence the final
    production step saw (prompt + all outputs but the last). Returns the fp32 reference logit of
    each chosen token at its sequence's last position, and the captured op inputs.
    `adapters`: per sequence, the LoRA adapter it was served with (None: the base model)."""
    args = model.args
    device = model.embed_tokens.weight.device
    lengths = [len(ids) for ids, _ in seqs]
    spans = [(end - n, end) for n, end in zip(lengths, itertools.accumulate(lengths), strict=True)]
    flat = [t for ids, _ in seqs for t in ids]
    ids = torch.tensor(flat, dtype=torch.long, device=device)  # [T]
    positions = torch.tensor([i for n in lengths for i in range(n)], device=device)
    num_tokens = ids.shape[0]
    x = model.embed_tokens.weight[ids].float()  # [T, H]; gather first, then upcast
    if model.scale_embeddings:
        x = x * args.hidden_size**0.5
    offset = model.norm_offset
    captured: OpInputs | None = None
    gather = getattr(model, "tp_gather", None)  # a tensor-parallel shard: see below
    for i, module in enumerate(model.layers):
        layer = cast(DecoderLayer, module)
        # Under tensor parallelism rank 0 holds a slice of each projection: the other ranks'
        # slices of this layer are gathered (runtime.models.parallel.gather) and their partial
        # products summed here, as the all_reduce does. Norms are replicated: rank 0's.
        ranks = [layer] if gather is None else [layer, *gather.layers(i)]
        normed = _norm(x, layer.input_norm, offset)
        h = x.clone()
        for part in ranks:
            pa = part.attn.args  # the part's heads (a shard's, under tensor parallelism)
            qkv = _lora(_linear(normed, part.attn.qkv_proj), normed, spans, adapters, i, "qkv")
            q, k, v = qkv.split([pa.q_size, pa.kv_size, pa.kv_size], -1)
            q = q.reshape(num_tokens, pa.num_heads, pa.head_dim)
            k = k.reshape(num_tokens, pa.num_kv_heads, pa.head_dim)
            v = v.reshape(num_tokens, pa.num_kv_heads, pa.head_dim)
            q_rot, k_rot = ops.rotary_ref(q, k, positions, pa.rope_theta, pa.head_dim)
            # per sequence: [Hq, n, D] x [Hkv, n, D] -> [Hq, n, D]; then back to [T, Hq * D]
            qs, ks, vs = (t.transpose(0, 1).split(lengths, dim=1) for t in (q_rot, k_rot, v))
            outs = [
                ops.attention_ref(q_seq, k_seq, v_seq, causal_offset=0)
                for q_seq, k_seq, v_seq in zip(qs, ks, vs, strict=True)
            ]
            out = torch.cat(outs, dim=1).transpose(0, 1).reshape(num_tokens, pa.q_size)
            h += _lora(_linear(out, part.attn.o_proj), out, spans, adapters, i, "o")
            if part is layer:  # rank 0's (the whole layer without tensor parallelism)
                mine = (q, k, v, q_rot, k_rot)
        normed_h = _norm(h, layer.post_attn_norm, offset)
        x_next = h.clone()
        for part in ranks:
            mlp = part.mlp
            gate_up = _lora(
                _linear(normed_h, mlp.gate_up_proj), normed_h, spans, adapters, i, "gate_up"
            )
            gate, up = gate_up.split([mlp.inter, mlp.inter], -1)
            if i == capture_layer and part is layer:
                captured = _capture(i, layer, x, lengths, positions, args, mine, gate, up)
            act = getattr(ops, f"{mlp.act}_ref")(gate, up)
            x_next += _lora(_linear(act, mlp.down_proj), act, spans, adapters, i, "down")
        x = x_next
    last_rows = torch.tensor(list(itertools.accumulate(lengths)), device=device) - 1
    last = _norm(x[last_rows], model.norm, offset)  # [N, H]
    chosen = torch.tensor([token for _, token in seqs], device=device)
    lm_head = model.lm_head
    if isinstance(lm_head, QuantizedLinear):  # the dequantized rows of the same int8 codes
        rows = lm_head.weight_rows(chosen)
    else:
        rows = (model.embed_tokens.weight if lm_head is None else lm_head.weight)[chosen].float()
    logits = (last * rows).sum(-1)  # [N]: only the chosen rows of the head
    assert captured is not None, f"capture_layer {capture_layer} out of range"
    return ReferenceResult(chosen_logits=logits.tolist(), inputs=captured)
