"""`load_model`: a HuggingFace-layout directory -> a ready `LoadedModel`.

The model is built on the `meta` device (no memory, no init), checkpoint tensors are checked against
the architecture's weight table (names and shapes, before any data is read), converted to the
requested dtype/device one by one, and installed with `load_state_dict(assign=True)`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from runtime.errors import ConfigError, ModelLoadError
from runtime.models import cpu_kernels, quant_checkpoint
from runtime.models.base import CausalLM
from runtime.models.bert import BertEncoder
from runtime.models.bounds import check_layers
from runtime.models.checkpoint import TensorSource, open_checkpoint
from runtime.models.config import ModelArgs
from runtime.models.cpu_kernels import stack
from runtime.models.families import GemmaForCausalLM, LlamaForCausalLM
from runtime.models.gguf_io.reader import is_gguf
from runtime.models.meta import meta_build
from runtime.models.quantize import QuantizationSummary, quantize_head, quantize_model
from runtime.models.weights import WeightEntry, is_ignored, weight_table

if TYPE_CHECKING:
    from runtime.models.tokenizer import Tokenizer

log = logging.getLogger("fastllm.models")
MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "gemma": GemmaForCausalLM,
    "bert": BertEncoder,
}
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass
class LoadedModel:
    model: nn.Module  # CausalLM or BertEncoder, eval mode, no grads
    args: ModelArgs
    tokenizer: Tokenizer | None  # None only when loaded with load_tokenizer=False
    device: torch.device
    dtype: torch.dtype
    path: Path
    is_legacy: bool = False  # loaded from pytorch_model.bin under legacy_support
    metadata: dict[str, str] = field(default_factory=dict)  # safetensors metadata (e.g. geglu fix)
    # weight-only quantization applied at load (runtime.models.quantize); None: float weights
    quantization: QuantizationSummary | None = None
    # fast decode steps built for this model, by (compile, cuda_graphs): runtime.models.fast
    fast_paths: dict[tuple[str, str], Any] = field(default_factory=dict, repr=False)
    # per-step thread choices measured on this model, by the most threads (engine.threads), so a
    # new engine on the same weights (offline generate) does not measure them again
    # (decode steps on a compiled CPU step under (most, "compiled"))
    step_threads: dict[int | tuple[int, str], Any] = field(default_factory=dict, repr=False)
    # tensor parallelism: rank 0's runtime.engine.tp.TPWorld (its workers); None: one process
    parallel: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.decide_decode_kernels()

    def decide_decode_kernels(self) -> None:
        """Decided once per loaded model (and again after a quantization at load): its lone
        one-token steps attend in one call of our own (runtime.models.cpu_kernels'
        decode_attend) on an fp32 CPU model where the kernels run, and go through the whole
        decoder stack in one call (cpu_kernels.stack) where its projections are all on them."""
        if isinstance(self.model, CausalLM):
            self.model.fused_decode = (
                self.device.type == "cpu" and self.dtype == torch.float32 and cpu_kernels.enabled()
            )
            model = self.model
            model.fused_stack = (
                stack.pack(
                    model.layers, model.args, norm_offset=model.norm_offset, mlp_act=model.mlp_act
                )
                if model.fused_decode
                else None
            )

    @property
    def is_causal_lm(self) -> bool:
        return isinstance(self.model, CausalLM)


def load_model(
    path: str | Path,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "auto",
    legacy_support: bool = False,
    load_tokenizer: bool = True,
    quantization: str | None = None,
    quant_group_size: int = 32,
    quantize_lm_head: bool = False,
) -> LoadedModel:
    """`quantization` (int8 | int4 | fp8) quantizes the decoder's linears after the float load
    (runtime.models.quantize), `quantize_lm_head` the LM head too (int8 per row, with int8 or
    int4, stored checkpoints included); the summary records what it cost."""
    path = Path(path)
    if is_gguf(path):  # a single llama.cpp file: metadata, weights and tokenizer in one
        loaded = load_gguf_model(path, dtype=dtype, device=device, load_tokenizer=load_tokenizer)
        if quantization is not None and quantization != "none":  # re-quantized from float
            loaded.quantization = quantize_model(
                loaded.model, quantization, group_size=quant_group_size
            )
            if quantize_lm_head:
                quantize_head(loaded.model, loaded.quantization)
            loaded.decide_decode_kernels()
        return loaded
    if not path.is_dir():
        raise ModelLoadError(f"model directory {path} does not exist")
    args = read_args(path)
    torch_dtype = resolve_dtype(dtype)
    torch_device = resolve_device(device)
    source = open_checkpoint(path, legacy_support=legacy_support)
    stored = source.metadata.get(quant_checkpoint.META_METHOD)  # a `convert --quantize` output
    if stored and quantization not in (None, "none", stored):
        raise ConfigError(
            f"{path} holds {stored} weights; quantization {quantization!r} cannot apply to them "
            f"(use none or {stored}, or quantize the float checkpoint)",
            param="quantization",
        )
    state = read_state(args, source, torch_dtype, torch_device, prequantized=bool(stored))
    with meta_build():
        model = MODEL_CLASSES[args.arch](args)
    summary = None
    if stored:
        summary = quant_checkpoint.install_quantized(
            model, args, source.get, set(source.names()), source.metadata, torch_device
        )
    model.load_state_dict(state, strict=True, assign=True)
    model.eval().requires_grad_(False)
    if not stored and quantization is not None and quantization != "none":
        if not isinstance(model, CausalLM):
            raise ConfigError("quantization applies to causal LMs only", param="quantization")
        summary = quantize_model(model, quantization, group_size=quant_group_size)
    if quantize_lm_head and summary is not None:  # a stored checkpoint's head is float: here too
        quantize_head(model, summary)
    tokenizer = None
    if load_tokenizer:
        from runtime.models.tokenizer import Tokenizer  # lazy: heavy, and optional in tests

        tokenizer = Tokenizer.from_dir(path)
    loaded = LoadedModel(
        model, args, tokenizer, torch_device, torch_dtype, path, source.is_legacy, source.metadata
    )
    loaded.quantization = summary
    return loaded


def load_gguf_model(
    path: Path,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "auto",
    load_tokenizer: bool = True,
    on_tensor: Callable[[str], None] | None = None,
) -> LoadedModel:
    """A GGUF file, dequantized to `dtype` (runtime.models.gguf_io)."""
    from runtime.models.gguf_io.args import model_args
    from runtime.models.gguf_io.reader import open_gguf
    from runtime.models.gguf_io.source import GGUFSource
    from runtime.models.gguf_io.tokenizer import load_gguf_tokenizer

    file = open_gguf(path)
    args = model_args(file)
    torch_dtype = resolve_dtype(dtype)
    torch_device = resolve_device(device)
    source = GGUFSource(file, args)
    source.on_tensor = on_tensor
    tokenizer = load_gguf_tokenizer(file) if load_tokenizer else None  # bad vocab: fail early
    started = time.perf_counter()
    log.info(
        "%s: dequantizing %d tensors (%s); `fastllm convert` once makes later starts fast",
        path,
        len(source.names()),
        source.metadata["fastllm.gguf_types"],
    )
    state = read_state(args, source, torch_dtype, torch_device)
    log.info("%s: dequantized in %.1f s", path, time.perf_counter() - started)
    with meta_build():
        model = MODEL_CLASSES[args.arch](args)
    model.load_state_dict(state, strict=True, assign=True)
    model.eval().requires_grad_(False)
    return LoadedModel(
        model, args, tokenizer, torch_device, torch_dtype, path, False, source.metadata
    )


def read_args(path: Path) -> ModelArgs:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{config_path} not found (not a HuggingFace model directory?)")
    try:
        cfg: Any = json.loads(config_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{config_path} is not valid JSON: {exc}") from exc
    return ModelArgs.from_hf_config(cfg)


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
    elif dtype in DTYPES:
        return DTYPES[dtype]
    raise ConfigError(
        f"unsupported dtype {dtype!r}; use float32, bfloat16 or float16", param="dtype"
    )


def resolve_device(device: str | torch.device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def read_state(
    args: ModelArgs,
    source: TensorSource,
    dtype: torch.dtype,
    device: torch.device,
    *,
    prequantized: bool = False,
) -> dict[str, Tensor]:
    """Float tensors by parameter name. `prequantized`: the projections' weights are stored
    quantized (runtime.models.quant_checkpoint) and are installed separately."""
    table = check_tensors(args, source, prequantized=prequantized)
    parts: dict[str, list[Tensor]] = {}
    for entry in table:  # fused targets collect their parts in table order
        tensor = source.get(entry.hf_name).to(device=device, dtype=dtype)
        parts.setdefault(entry.target, []).append(tensor)
    return {
        name: (ts[0] if len(ts) == 1 else torch.cat(ts)).contiguous() for name, ts in parts.items()
    }


def check_tensors(
    args: ModelArgs, source: TensorSource, *, prequantized: bool = False
) -> list[WeightEntry]:
    """Names and shapes against the weight table, before any tensor data is read."""
    check_layers(args.num_layers, source.names())  # the table grows with the declared count
    table = weight_table(args)
    if prequantized:
        replaced = {
            n for names in quant_checkpoint.projection_sources(args).values() for n in names
        }
        table = [e for e in table if e.hf_name not in replaced]
    present = {n for n in source.names() if not quant_checkpoint.is_quantized_tensor(n)}
    missing = [e.hf_name for e in table if e.hf_name not in present]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(f"checkpoint is missing tensor {missing[0]!r}{more}")
    known = {e.hf_name for e in table}
    unexpected = sorted(n for n in present - known if not is_ignored(args, n))
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise ModelLoadError(
            f"checkpoint has unexpected tensor {unexpected[0]!r}{more} for {args.architecture}"
        )
    for entry in table:
        shape = source.shape(entry.hf_name)
        if shape != entry.shape:
            raise ModelLoadError(
                f"tensor {entry.hf_name!r} has shape {list(shape)}, config.json implies "
                f"{list(entry.shape)}"
            )
    return table
