"""A lone token's whole decoder stack in one call of our own (stack.cpp), for quantized
llama-family models on the CPUs where the kernels run.

Why: with the projections on our kernels (gemv.cpp), SmolLM2-135M's int4 decode step on a
2-core AVX2 EPYC was ~17 ms of GEMMs and ~15 ms of the ~8 torch ops a layer between them and
the Python around them (each op 3-10 us there). stack.cpp runs the same layer (layers.py's
DecoderLayer, ops.rms_norm / rotary / swiglu written out in fp32) with no op in between.

`pack(...)` decides once per loaded model (runtime.models.loader, after any quantization)
whether the model can: a `CausalLM` of the llama family (RMSNorm without offset, SwiGLU, no
biases) whose every projection holds a kernel pack (`QuantizedLinear.gemv`) and none is
replaced per instance (tensor parallelism's all_reduce wraps `add_to_`). Its result rides on
the model (`CausalLM.fused_stack`); the forward takes it for the steps `BatchPlan.fused_decode`
marks (a lone one-token step over fp32 pages). Everything else (prefills, batches,
float models, other families) runs the layers as before. A float model never comes here, so a
patched op of runtime.models.ops (the verification tests' faulty kernels) still runs on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from runtime.models.config import ModelArgs
from runtime.models.layers import DecoderLayer
from runtime.models.quant import QuantizedLinear


@dataclass(frozen=True)
class FusedStack:
    """The stack's weights in stack.cpp's order: per layer the input norm, qkv's tensors, o's,
    the post-attention norm, gate_up's, down's; `counts` gives each projection's tensor count
    (3 int4, 2 int8)."""

    weights: list[Tensor]
    counts: list[int]
    num_heads: int
    intermediate: int
    eps: float

    def run(
        self, x: Tensor, cos: Tensor, sin: Tensor, pool: Tensor, pages: list[int], past: int
    ) -> Tensor:
        """x [1, H] fp32, updated in place through every layer (returned); cos, sin the token's
        rotary rows; pool all layers' pages [layers, 2, Hkv, pages, page_size, D]; `pages` the
        sequence's page table, the token's K/V written at position `past` of it."""
        torch.ops.fastllm_cpu.decode_stack(
            x,
            self.weights,
            self.counts,
            cos.reshape(-1),
            sin.reshape(-1),
            pool,
            pages,
            past,
            self.num_heads,
            self.intermediate,
            self.eps,
        )
        return x


def pack(
    layers: Iterable[nn.Module], args: ModelArgs, *, norm_offset: float, mlp_act: str
) -> FusedStack | None:
    """A causal LM's `FusedStack` from its decoder layers and family knobs (`CausalLM`'s), or
    None where stack.cpp cannot run it (module doc)."""
    if norm_offset != 0.0 or mlp_act != "swiglu":
        return None
    weights: list[Tensor] = []
    counts: list[int] = []
    for layer in layers:
        if type(layer) is not DecoderLayer:
            return None
        attn, mlp = layer.attn, layer.mlp
        modules = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if not all(_packed(m) for m in modules):
            return None
        for norm, pair in ((layer.input_norm, modules[:2]), (layer.post_attn_norm, modules[2:])):
            weight = norm.weight.detach()
            if weight.dtype != torch.float32 or not weight.is_contiguous():
                return None
            weights.append(weight)
            for m in pair:
                assert isinstance(m, QuantizedLinear)
                weights.extend(m.gemv)
                counts.append(len(m.gemv))
    return FusedStack(weights, counts, args.num_heads, args.intermediate_size, args.norm_eps)


def _packed(module: nn.Module) -> bool:
    """A quantized projection with a kernel pack, no bias, nothing replaced on the instance."""
    return (
        isinstance(module, QuantizedLinear)
        and bool(module.gemv)
        and module.bias is None
        and "add_to_" not in vars(module)
        and "forward" not in vars(module)
    )
