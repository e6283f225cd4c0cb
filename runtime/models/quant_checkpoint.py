"""Quantized checkpoints on disk (`fastllm convert --quantize`, read back by `load_model`).

Layout (safetensors, `fastllm.quant_layout` = "fastllm-v1"): every tensor of the float checkpoint
under its HF name, except the decoder projections' weights, which are stored per fused projection
under this runtime's module name (`layers.{i}.attn.qkv_proj`, `.attn.o_proj`, `.mlp.gate_up_proj`,
`.mlp.down_proj`) as
    int8: `<proj>.codes`  int8 [out, in] and `<proj>.scales` fp32 [out] (w = codes * scale)
    int4: `<proj>.codes4` uint8 [out, in / 2], two codes a byte, low nibble first along `in`;
          `<proj>.scales`, `<proj>.zeros` fp32 [out, in / group]
          (w = (q - 8) * scale + zero; the group is `fastllm.quant_group_size`).
The layout is our own, not torch's packed kernel layout (which differs per device and release):
the kernel's packing is redone at load, in milliseconds. Projection biases stay under HF names.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from runtime.errors import ModelLoadError
from runtime.models.config import ModelArgs
from runtime.models.quant import (
    INT4_GROUP_SIZES,
    Int4Linear,
    Int8Linear,
    QuantReport,
    _pack_nibbles,
    _unpack_nibbles,
)
from runtime.models.quantize import PROJECTIONS, QuantizationSummary, method_for, quantize_linear
from runtime.models.weights import weight_table

META_METHOD = "fastllm.quantization"
META_GROUP = "fastllm.quant_group_size"
META_LAYOUT = "fastllm.quant_layout"
LAYOUT = "fastllm-v1"
SUFFIXES = (".codes", ".codes4", ".scales", ".zeros")


def projection_sources(args: ModelArgs) -> dict[str, list[str]]:
    """Fused projection (`layers.0.attn.qkv_proj`) -> its HF weight names, in fusing order."""
    out: dict[str, list[str]] = {}
    wanted = {p + ".weight" for p in PROJECTIONS}
    for entry in weight_table(args):
        _, _, rest = entry.target.partition(".")[2].partition(".")
        if entry.target.startswith("layers.") and rest in wanted:
            out.setdefault(entry.target.removesuffix(".weight"), []).append(entry.hf_name)
    return out


def is_quantized_tensor(name: str) -> bool:
    return name.startswith("layers.") and name.endswith(SUFFIXES)


def quantize_tensors(
    args: ModelArgs,
    get: Callable[[str], Tensor],
    method: str,
    group_size: int,
    on_projection: Callable[[str, int, int], None] | None = None,
) -> tuple[dict[str, Tensor], list[QuantReport], set[str]]:
    """Quantize every decoder projection of a float checkpoint read through `get(hf_name)`.
    Returns the tensors to store, what each quantization cost, and the HF names they replace."""
    tensors: dict[str, Tensor] = {}
    reports: list[QuantReport] = []
    replaced: set[str] = set()
    sources = projection_sources(args)
    for index, (prefix, names) in enumerate(sources.items()):
        weight = torch.cat([get(n).float() for n in names])
        layer, report = quantize_linear(
            prefix, weight, None, method_for(method, weight.shape[1], group_size),
            group_size=group_size,
        )  # fmt: skip
        tensors.update(serialize(prefix, layer))
        reports.append(report)
        replaced.update(names)
        if on_projection is not None:
            on_projection(prefix, index + 1, len(sources))
    return tensors, reports, replaced


def serialize(prefix: str, layer: nn.Module) -> dict[str, Tensor]:
    if isinstance(layer, Int8Linear):
        return {f"{prefix}.codes": layer.codes.cpu(), f"{prefix}.scales": layer.scales.cpu()}
    if isinstance(layer, Int4Linear):
        return {
            f"{prefix}.codes4": _pack_nibbles(layer.codes()).view(layer.out_features, -1).cpu(),
            f"{prefix}.scales": layer.scales_zeros[..., 0].t().contiguous().cpu(),
            f"{prefix}.zeros": layer.scales_zeros[..., 1].t().contiguous().cpu(),
        }
    raise ModelLoadError(f"{prefix}: {type(layer).__name__} cannot be stored in a checkpoint")


def install_quantized(
    model: nn.Module,
    args: ModelArgs,
    get: Callable[[str], Tensor],
    names: set[str],
    metadata: dict[str, str],
    device: torch.device,
) -> QuantizationSummary:
    """Replace each projection of a model built on `meta` by its stored quantized form. Every
    inconsistency is a one-line ModelLoadError naming the tensor."""
    method = metadata.get(META_METHOD, "")
    if metadata.get(META_LAYOUT) != LAYOUT or method not in ("int8", "int4"):
        raise ModelLoadError(
            f"unknown quantized layout {metadata.get(META_LAYOUT)!r} / method {method!r} "
            f"(this runtime reads {LAYOUT}, int8 or int4)"
        )
    try:
        group_size = int(metadata.get(META_GROUP, "0"))
    except ValueError:
        group_size = 0
    if method == "int4" and group_size not in INT4_GROUP_SIZES:
        raise ModelLoadError(
            f"unknown int4 group size {metadata.get(META_GROUP)!r} in {META_GROUP} "
            f"(one of {list(INT4_GROUP_SIZES)})"
        )
    summary = QuantizationSummary(method, group_size if method == "int4" else 0)
    for prefix, hf_names in projection_sources(args).items():
        out_f = sum(_expected_rows(args, n) for n in hf_names)
        layer = _read_layer(prefix, get, names, group_size, out_f)
        parent_path, attr = prefix.rsplit(".", 1)
        parent = model.get_submodule(parent_path)
        old = getattr(parent, attr)
        if layer.in_features != old.weight_t.shape[0]:
            raise ModelLoadError(
                f"{prefix}: stored in_features {layer.in_features}, config.json implies "
                f"{old.weight_t.shape[0]}"
            )
        if old.bias is not None:  # filled from the checkpoint's HF bias by load_state_dict
            layer.bias = nn.Parameter(torch.empty(out_f, device=device), requires_grad=False)
        setattr(parent, attr, layer.to(device))
        summary.layers.append(
            QuantReport(prefix, layer.method, layer.group_size, layer.weight_bytes, 0, 0.0, 0.0)
        )
    return summary


def _expected_rows(args: ModelArgs, hf_name: str) -> int:
    for entry in weight_table(args):
        if entry.hf_name == hf_name:
            return entry.shape[0]
    raise ModelLoadError(f"no weight-table entry for {hf_name!r}")


def _read_layer(
    prefix: str, get: Callable[[str], Tensor], names: set[str], group_size: int, out_f: int
) -> Int8Linear | Int4Linear:
    def need(suffix: str) -> Tensor:
        name = prefix + suffix
        if name not in names:
            raise ModelLoadError(f"quantized checkpoint is missing tensor {name!r}")
        return get(name)

    if prefix + ".codes" in names:
        codes, scales = need(".codes"), need(".scales")
        if codes.shape[0] != out_f:
            raise ModelLoadError(f"{prefix}.codes has {codes.shape[0]} rows, expected {out_f}")
        return Int8Linear(codes, scales, None)
    packed, scales, zeros = need(".codes4"), need(".scales"), need(".zeros")
    if packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[0] != out_f:
        raise ModelLoadError(
            f"{prefix}.codes4 must be uint8 [{out_f}, in/2]; got {packed.dtype} "
            f"{list(packed.shape)}"
        )
    in_f = packed.shape[1] * 2
    codes = _unpack_nibbles(packed.flatten(), out_f, in_f)
    return Int4Linear(codes, scales, zeros, group_size, None)
