"""Quantize a loaded causal LM's decoder linears in place (`quantization` setting, `--quantize`).

The decoder layers' projections (QKV, O, gate/up, down) take the method asked for. The LM head
stays in the serving dtype unless `quantize_lm_head` asks for int8 (one scale per vocabulary row,
with int8 and int4 layers alike): on a small model it is the largest GEMM of a batch-1 step
(SmolLM2-135M: 49,152 x 576, 113 MB of fp32 read per token, 47% of an int4 step, measured; int8
made decode 1.37x faster) but its error lands directly on the logits (greedy agreement with fp32
96.9% -> 93.8% for int8, 98.6% -> 94.5% for int4), so it is opt-in, as vLLM's `lm_head`
quantization is. The embedding table stays in the serving dtype (a gather, not a GEMM); on a
tied model the head is an int8 copy of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from runtime.errors import ConfigError
from runtime.models.layers import Linear
from runtime.models.quant import METHODS, Int4Linear, Int8Linear, QuantReport, report
from runtime.models.quant_fp8 import Fp8Linear

PROJECTIONS = ("attn.qkv_proj", "attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


@dataclass
class QuantizationSummary:
    method: str  # int8 | int4 | fp8
    group_size: int  # int4's group; int8/fp8: per output channel (0 here)
    layers: list[QuantReport] = field(default_factory=list)  # the decoder projections
    head: QuantReport | None = None  # the int8 LM head (quantize_head, when asked)

    @property
    def all_layers(self) -> list[QuantReport]:
        return self.layers + ([self.head] if self.head is not None else [])

    @property
    def weight_bytes(self) -> int:
        return sum(r.weight_bytes for r in self.all_layers)

    @property
    def float_bytes(self) -> int:
        return sum(r.float_bytes for r in self.all_layers)

    @property
    def fallbacks(self) -> list[str]:
        """Layers stored in another format than asked (int4 groups that cannot tile them)."""
        return [r.name for r in self.layers if r.method != self.method]

    @property
    def max_abs_error(self) -> float:
        return max((r.max_abs_error for r in self.all_layers), default=0.0)

    @property
    def rel_rms_error(self) -> float:
        """The worst layer's relative RMS error (what quantization itself cost)."""
        return max((r.rel_rms_error for r in self.all_layers), default=0.0)


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ConfigError(
            f"unknown quantization {method!r}; use one of {', '.join(METHODS)} (or none)",
            param="quantization",
        )


def quantize_linear(
    name: str, weight: Tensor, bias: Tensor | None, method: str, *, group_size: int = 32
) -> tuple[nn.Module, QuantReport]:
    """Quantize one [out, in] float weight; returns the layer and what quantization cost."""
    layer: Int8Linear | Int4Linear
    if method == "int8":
        layer = Int8Linear.quantize(weight, bias)
    elif method == "int4":
        layer = Int4Linear.quantize(weight, bias, group_size)
    elif method == "fp8":
        return Fp8Linear.quantize(name, weight, bias)  # CUDA >= 8.9 only; refuses elsewhere
    else:
        raise ConfigError(
            f"unknown quantization {method!r}; use one of {', '.join(METHODS)}",
            param="quantization",
        )
    return layer, report(name, weight, layer)


def method_for(method: str, in_features: int, group_size: int) -> str:
    """int4's groups must tile a layer's input features; a layer they cannot tile is int8."""
    if method == "int4" and in_features % group_size:
        return "int8"
    return method


@torch.inference_mode()
def quantize_model(model: nn.Module, method: str, *, group_size: int = 32) -> QuantizationSummary:
    """Replace each decoder projection (`layers.L.<proj>`) by its quantized form."""
    check_method(method)
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ConfigError("quantization applies to causal LMs only", param="quantization")
    summary = QuantizationSummary(method, group_size if method == "int4" else 0)
    for idx, layer in enumerate(layers):
        for path in PROJECTIONS:
            parent_name, attr = path.split(".")
            parent = getattr(layer, parent_name)
            linear = getattr(parent, attr)
            if not isinstance(linear, Linear):
                continue  # already quantized (a packed checkpoint)
            name = f"layers.{idx}.{path}"
            bias = None if linear.bias is None else linear.bias.detach().clone()
            weight = linear.weight.detach()
            layer_method = method_for(method, weight.shape[1], group_size)
            quantized, report = quantize_linear(
                name, weight, bias, layer_method, group_size=group_size
            )
            setattr(parent, attr, quantized)
            summary.layers.append(report)
    return summary


@torch.inference_mode()
def quantize_head(model: nn.Module, summary: QuantizationSummary) -> None:
    """The LM head as int8 per vocabulary row, for int8 and int4 models (fp8 keeps its float
    head). A stored quantized checkpoint keeps the head in float; the loader calls this for it
    too when asked."""
    if summary.method not in ("int8", "int4") or summary.head is not None:
        return
    head = getattr(model, "lm_head", None)
    weight = getattr(model.embed_tokens if head is None else head, "weight", None)
    assert isinstance(weight, Tensor)
    layer = Int8Linear.quantize(weight.detach(), None)
    model.lm_head = layer  # tied: the embedding table stays for the lookups
    summary.head = report("lm_head", weight, layer)


def is_quantized(model: nn.Module) -> bool:
    return any(getattr(m, "method", None) in METHODS for m in model.modules())


def runs_cpu_kernels(model: nn.Module) -> bool:
    """Whether a quantized layer of the model runs runtime.models.cpu_kernels's kernels (their
    activations rounded to int8: runtime.verify.tolerance's INT8_BLOCKS chain)."""
    return any(bool(getattr(m, "gemv", ())) for m in model.modules())


# the dense copies of quantized layers, bf16 or fp32 (runtime.models.dense_batch)
DENSE_KEY = "dense"


def weight_bytes_by_format(model: nn.Module) -> dict[str, int]:
    """Resident weight bytes per storage format (`int8`, `int4`, `fp8`, or the float dtype)."""
    out: dict[str, int] = {}
    seen: set[int] = set()
    for module in model.modules():
        method = getattr(module, "method", None)
        if method in METHODS:
            out[method] = out.get(method, 0) + int(module.weight_bytes)  # type: ignore[arg-type]
            dense = getattr(module, "dense", None)  # runtime.models.dense_batch
            if dense is not None:
                out[DENSE_KEY] = out.get(DENSE_KEY, 0) + dense.nbytes
            seen.update(id(b) for b in module.buffers())
            seen.update(id(p) for p in module.parameters())
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) in seen or tensor.device.type == "meta":
            continue
        seen.add(id(tensor))
        key = str(tensor.dtype).removeprefix("torch.")
        out[key] = out.get(key, 0) + tensor.nbytes
    return out
