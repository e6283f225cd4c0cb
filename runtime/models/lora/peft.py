"""Reading a PEFT LoRA adapter directory: `adapter_config.json` + `adapter_model.safetensors`
(through the checkpoint module's safe loader; a pickle `adapter_model.bin` is refused, never
opened), validated against the base model before a byte reaches the device.

Supported: `r`, `lora_alpha`, `use_rslora` (scale alpha / sqrt(r) instead of alpha / r), and
LoRA on the decoder's q/k/v/o/gate/up/down projections of any subset of layers (the tensors
present say which). Everything else PEFT can express (DoRA, per-module rank or alpha patterns,
trained biases, `modules_to_save`, embeddings or lm_head) is refused by name rather than
silently ignored: a silently ignored option would serve a different model than the one trained.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from runtime.errors import ModelLoadError
from runtime.models.checkpoint import TensorSource, _open_safetensors
from runtime.models.config import ModelArgs
from runtime.models.lora.errors import LoraAdapterError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLE_FILES = ("adapter_model.bin", "adapter_model.pt", "adapter_model.pth")
# short module name (PEFT's target_modules spelling) -> where it sits in a decoder layer
MODULES = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}
_NAME = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\."
    r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.lora_([AB])(?:\.default)?\.weight$"
)
# options that change the math; a non-default value is refused (see the module docstring)
_REFUSED: dict[str, tuple[Any, Any]] = {
    "use_dora": (False, None),
    "rank_pattern": ({}, None),
    "alpha_pattern": ({}, None),
    "modules_to_save": (None, []),
    "bias": ("none", None),
    "fan_in_fan_out": (False, None),
    "lora_bias": (False, None),
    "use_qalora": (False, None),
    "target_parameters": (None, []),
    "trainable_token_indices": (None, []),
}


@dataclass(frozen=True)
class LoraConfig:
    rank: int  # r
    alpha: float  # lora_alpha
    use_rslora: bool  # scale = alpha / sqrt(r) (rank-stabilized) instead of alpha / r

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


@dataclass
class AdapterTensors:
    """A validated adapter on the CPU: (layer, module) -> (A [r, in], B [out, r])."""

    path: Path
    config: LoraConfig
    modules: dict[tuple[int, str], tuple[Tensor, Tensor]]

    @property
    def target_modules(self) -> list[str]:
        return sorted({name for _, name in self.modules})

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.modules.values())


def resolve_adapter_path(path: str | Path, lora_dir: str | Path | None) -> Path:
    """The adapter's directory; with `lora_dir` set, relative paths are under it and a path that
    resolves outside it (`..`, a symlink) is refused."""
    raw = Path(path)
    if lora_dir is None:
        return raw
    root = Path(lora_dir).resolve()
    resolved = (root / raw).resolve() if not raw.is_absolute() else raw.resolve()
    if resolved != root and root not in resolved.parents:
        raise LoraAdapterError(
            f"adapter path {str(path)!r} is outside the adapter directory {str(root)!r}",
            param="lora_path",
            code="lora_path_outside",
        )
    return resolved


def read_adapter(path: str | Path, args: ModelArgs, *, max_rank: int) -> AdapterTensors:
    """Read and validate a PEFT adapter against the base model `args` (LoraAdapterError)."""
    path = Path(path)
    if not path.is_dir():
        raise _error(f"adapter directory {str(path)!r} does not exist", "lora_not_found")
    pickles = [name for name in PICKLE_FILES if (path / name).is_file()]
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        if pickles:
            raise _error(
                f"{path}: only a pickle ({pickles[0]}) found; adapters are read from "
                f"{WEIGHTS_FILE} only (convert it with PEFT's save_pretrained(safe_serialization"
                "=True))",
                "lora_unsafe_file",
            )
        raise _error(f"{path}: missing {WEIGHTS_FILE}", "lora_missing_file")
    config = _read_config(path, max_rank)
    try:
        source = _open_safetensors([weights])
    except ModelLoadError as exc:
        raise _error(f"{path}: {exc.message}", "lora_corrupt_file") from exc
    modules = _read_modules(path, source, args, config)
    return AdapterTensors(path=path, config=config, modules=modules)


def _read_config(path: Path, max_rank: int) -> LoraConfig:
    file = path / CONFIG_FILE
    if not file.is_file():
        raise _error(f"{path}: missing {CONFIG_FILE}", "lora_missing_file")
    try:
        raw: Any = json.loads(file.read_text())
    except (ValueError, OSError) as exc:
        raise _error(f"{file}: not valid JSON ({exc})", "lora_bad_config") from exc
    if not isinstance(raw, dict):
        raise _error(f"{file}: not a JSON object", "lora_bad_config")
    peft_type = raw.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise _error(f"{file}: peft_type {peft_type!r} is not LORA", "lora_bad_config")
    for key, defaults in _REFUSED.items():
        if key in raw and raw[key] not in defaults:
            raise _error(f"{file}: {key}={raw[key]!r} is not supported", "lora_unsupported")
    rank, alpha = raw.get("r"), raw.get("lora_alpha", raw.get("r"))
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise _error(f"{file}: r must be a positive integer, got {rank!r}", "lora_bad_config")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise _error(f"{file}: lora_alpha must be a number, got {alpha!r}", "lora_bad_config")
    if rank > max_rank:
        raise _error(
            f"{file}: rank {rank} is above max_lora_rank ({max_rank})", "lora_rank_too_large"
        )
    return LoraConfig(rank=rank, alpha=float(alpha), use_rslora=bool(raw.get("use_rslora")))


def _read_modules(
    path: Path, source: TensorSource, args: ModelArgs, config: LoraConfig
) -> dict[tuple[int, str], tuple[Tensor, Tensor]]:
    halves: dict[tuple[int, str], dict[str, str]] = {}
    for name in source.names():
        match = _NAME.match(name)
        if match is None:
            raise _error(f"{path}: unsupported tensor {name!r}", "lora_unsupported")
        layer, module, half = int(match[1]), match[3], match[4]
        if layer >= args.num_layers:
            raise _error(
                f"{path}: tensor {name!r} names layer {layer}; the model has {args.num_layers}",
                "lora_shape_mismatch",
            )
        halves.setdefault((layer, module), {})[half] = name
    if not halves:
        raise _error(f"{path}: no LoRA tensors in {WEIGHTS_FILE}", "lora_missing_tensor")
    modules: dict[tuple[int, str], tuple[Tensor, Tensor]] = {}
    for key, names in sorted(halves.items()):
        if set(names) != {"A", "B"}:
            missing = "lora_B" if "A" in names else "lora_A"
            raise _error(f"{path}: layer {key[0]} {key[1]} lacks {missing}", "lora_missing_tensor")
        fan_in, fan_out = _fan(args, key[1])
        want = {"A": (config.rank, fan_in), "B": (fan_out, config.rank)}
        for half, name in names.items():
            shape = source.shape(name)
            if shape != want[half]:
                raise _error(
                    f"{path}: {name} has shape {list(shape)}, the base model needs "
                    f"{list(want[half])}",
                    "lora_shape_mismatch",
                )
        a, b = source.get(names["A"]), source.get(names["B"])
        if not (a.is_floating_point() and b.is_floating_point()):
            raise _error(f"{path}: {names['A']} is not a float tensor", "lora_bad_dtype")
        modules[key] = (a.to(torch.float32), b.to(torch.float32))
    return modules


def _fan(args: ModelArgs, module: str) -> tuple[int, int]:
    """(in, out) features of a decoder projection."""
    hidden, inter = args.hidden_size, args.intermediate_size
    return {
        "q_proj": (hidden, args.q_size),
        "k_proj": (hidden, args.kv_size),
        "v_proj": (hidden, args.kv_size),
        "o_proj": (args.q_size, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }[module]


def _error(message: str, code: str) -> LoraAdapterError:
    return LoraAdapterError(message, param="lora_path", code=code)
