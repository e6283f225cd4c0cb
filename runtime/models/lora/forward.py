"""The forward of a step whose batch has rows with adapters: the model's own forward (same
modules, same paged attention), plus each group's LoRA delta on its rows.

The engine orders a LoRA step's sequences so that each adapter's rows are one contiguous run of
the packed batch (`LoraGroup.start:end`); rows without an adapter pay nothing, and a group's
delta is two GEMMs per fused projection on a slice, no gather or scatter:

    y[s:e] += (x[s:e] @ a_t) @ b_t          # a_t [in, R], b_t [R, out] scaled (weights.py)

The layer's halves are spelled out here (`Attention.qkv`, `GatedMLP.add_to_`: the same modules
and ops, in the same order) so each delta lands on the fused projection's output before what
follows it (q and k rotated after their delta; the activation after gate/up's). Attention then
writes the adapted K/V into the pages (which the prefix cache keys by adapter: the engine's
salt). tests/runtime/lora/test_parity.py holds this to PEFT on the same checkpoint.

Runs eagerly (never the compiled or captured fast path), like any step with a prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from runtime.models import ops
from runtime.models.base import CausalLM
from runtime.models.batch_plan import BatchPlan, SeqSlice
from runtime.models.layers import DecoderLayer
from runtime.models.lora.weights import LayerLora, LoraWeights, Pair


@dataclass(frozen=True)
class LoraGroup:
    start: int  # the group's rows are [start, end) of the packed batch
    end: int
    weights: LoraWeights


def _add_delta(out: Tensor, x: Tensor, pair: Pair) -> None:
    """out [n, out] += (x [n, in] @ a_t) @ b_t, in place."""
    a_t, b_t = pair
    out.addmm_(torch.mm(x, a_t), b_t)


@torch.no_grad()
def lora_forward(
    model: CausalLM, input_ids: Tensor, seqs: Sequence[SeqSlice], groups: Sequence[LoraGroup]
) -> Tensor:
    """CausalLM.forward with the groups' deltas: input_ids [T] -> hidden [T, H] (normed)."""
    args = model.args
    plan = BatchPlan.build(seqs, input_ids, args.num_heads // args.num_kv_heads)
    cos, sin = model.rope_table().lookup(plan.positions)  # [T, 1, head_dim] each
    x = model.embed(input_ids)
    for i, layer in enumerate(model.layers):
        assert isinstance(layer, DecoderLayer)
        per_group = [(g.start, g.end, g.weights.layers[i]) for g in groups]
        x = _layer(layer, x, plan, cos, sin, per_group)
    return model.norm(x)


def _layer(
    layer: DecoderLayer,
    x: Tensor,
    plan: BatchPlan,
    cos: Tensor,
    sin: Tensor,
    groups: list[tuple[int, int, LayerLora]],
) -> Tensor:
    """DecoderLayer.forward, each group's delta added after each projection it adapts."""
    attn, mlp, a = layer.attn, layer.mlp, layer.attn.args
    xn = layer.input_norm(x)
    # Attention.qkv with the delta added to the fused projection before q and k are rotated
    qkv = attn.qkv_proj(xn)  # [T, q_size + 2 * kv_size]
    for s, e, lora in groups:
        if lora.qkv is not None:
            _add_delta(qkv[s:e], xn[s:e], lora.qkv)
    num_tokens, qk_size = qkv.shape[0], a.q_size + a.kv_size
    qk = qkv[:, :qk_size].view(num_tokens, a.num_heads + a.num_kv_heads, a.head_dim)
    q, k = ops.rotary(qk, cos, sin).split([a.num_heads, a.num_kv_heads], dim=1)
    v = qkv[:, qk_size:].view(num_tokens, a.num_kv_heads, a.head_dim)
    out = attn.attend(q, k, v, plan)  # [T, q_size]
    attn.o_proj.add_to_(x, out)
    for s, e, lora in groups:
        if lora.o is not None:
            _add_delta(x[s:e], out[s:e], lora.o)
    # GatedMLP.add_to_ with the gate/up and down deltas
    xn = layer.post_attn_norm(x)
    gate_up = mlp.gate_up_proj(xn)  # [T, 2 * inter]
    for s, e, lora in groups:
        if lora.gate_up is not None:
            _add_delta(gate_up[s:e], xn[s:e], lora.gate_up)
    act = getattr(ops, mlp.act)(gate_up[:, : mlp.inter], gate_up[:, mlp.inter :])
    mlp.down_proj.add_to_(x, act)
    for s, e, lora in groups:
        if lora.down is not None:
            _add_delta(x[s:e], act[s:e], lora.down)
    return x
