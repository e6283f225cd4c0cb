"""An adapter laid out for the model's fused projections, in one flat buffer.

The model fuses q/k/v into one projection and gate/up into another (runtime.models.layers), so
an adapter's matrices are fused the same way: per layer and fused projection one `a_t`
[in, R] (the targeted modules' A^T side by side) and one `b_t` [R, out] (their B^T, scaled, each
in its own rows and columns, zero elsewhere). The delta of a fused projection is then two GEMMs,
`(x @ a_t) @ b_t`, whatever subset of its modules the adapter targets. The zeros cost R x out
multiply-adds per row (R <= 3 r): small beside the base GEMM's in x out.

Layout as the base `Linear` keeps it (transposed, contiguous: runtime.models.layers says why),
in the activation dtype (quantized base weights included: the delta never touches them), the
scale folded into `b_t`. Every tensor is a view of one buffer that the caller provides (the
engine's allocator block): one owner, one release.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from runtime.models.config import ModelArgs
from runtime.models.lora.peft import AdapterTensors

# fused projection -> its modules in the order of the fused output columns
FUSED = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}

Pair = tuple[Tensor, Tensor]  # (a_t [in, R], b_t [R, out])


@dataclass
class LayerLora:
    """One layer's fused pairs; None where the adapter targets none of the modules."""

    qkv: Pair | None = None
    o: Pair | None = None
    gate_up: Pair | None = None
    down: Pair | None = None


@dataclass
class LoraWeights:
    layers: list[LayerLora] = field(default_factory=list)
    numel: int = 0  # elements of the buffer the pairs are views of


def _columns(args: ModelArgs, fused: str) -> list[tuple[str, int]]:
    hidden, inter = args.hidden_size, args.intermediate_size
    widths = {
        "q_proj": args.q_size,
        "k_proj": args.kv_size,
        "v_proj": args.kv_size,
        "o_proj": hidden,
        "gate_proj": inter,
        "up_proj": inter,
        "down_proj": hidden,
    }
    return [(m, widths[m]) for m in FUSED[fused]]


def _plan(adapter: AdapterTensors, args: ModelArgs) -> list[dict[str, tuple[int, int, int]]]:
    """Per layer: fused -> (fan_in, R, out) of the pair it needs."""
    plans: list[dict[str, tuple[int, int, int]]] = []
    for layer in range(args.num_layers):
        plan: dict[str, tuple[int, int, int]] = {}
        for fused in FUSED:
            cols = _columns(args, fused)
            ranks = [
                adapter.modules[(layer, m)][0].shape[0]
                for m, _ in cols
                if (layer, m) in adapter.modules
            ]
            if ranks:
                first = next(m for m, _ in cols if (layer, m) in adapter.modules)
                fan_in = adapter.modules[(layer, first)][0].shape[1]
                plan[fused] = (fan_in, sum(ranks), sum(w for _, w in cols))
        plans.append(plan)
    return plans


def packed_numel(adapter: AdapterTensors, args: ModelArgs) -> int:
    """Elements of the flat buffer `pack_adapter` needs (the engine allocates it)."""
    return sum(
        fan_in * rank + rank * out
        for plan in _plan(adapter, args)
        for fan_in, rank, out in plan.values()
    )


def pack_adapter(
    adapter: AdapterTensors, args: ModelArgs, buffer: Tensor, *, scale: float | None = None
) -> LoraWeights:
    """Fill `buffer` (1-D, `packed_numel` elements, the activation dtype and device) and return
    the per-layer views into it."""
    scale = adapter.config.scale if scale is None else scale
    take = _taker(buffer)
    weights = LoraWeights(numel=buffer.numel())
    for layer, plan in enumerate(_plan(adapter, args)):
        layer_lora = LayerLora()
        for fused, (fan_in, rank, out) in plan.items():
            a_t, b_t = take((fan_in, rank)), take((rank, out))
            b_t.zero_()
            r0 = c0 = 0
            for module, width in _columns(args, fused):
                pair = adapter.modules.get((layer, module))
                if pair is not None:
                    a, b = pair  # [r, in], [out, r]
                    r = a.shape[0]
                    a_t[:, r0 : r0 + r].copy_(a.t())
                    b_t[r0 : r0 + r, c0 : c0 + width].copy_((b * scale).t())
                    r0 += r
                c0 += width
            setattr(layer_lora, fused, (a_t, b_t))
        weights.layers.append(layer_lora)
    return weights


def _taker(buffer: Tensor) -> Callable[[tuple[int, int]], Tensor]:
    offset = 0

    def take(shape: tuple[int, int]) -> Tensor:
        nonlocal offset
        n = shape[0] * shape[1]
        if offset + n > buffer.numel():
            raise ValueError(f"LoRA buffer of {buffer.numel()} elements is too small")
        view = buffer[offset : offset + n].view(shape)
        offset += n
        return view

    return take


def cpu_buffer(adapter: AdapterTensors, args: ModelArgs, dtype: torch.dtype) -> Tensor:
    """A plain buffer (tests, the reference): what the engine takes from its allocator."""
    return torch.empty(packed_numel(adapter, args), dtype=dtype)
