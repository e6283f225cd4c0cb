"""Weight conversion: an old checkpoint directory -> a safetensors checkpoint with provenance.
(A GGUF file as input: runtime.tools.convert_gguf; `fastllm convert` picks by input.)

Reads safetensors, or legacy torch files (`pytorch_model.bin`, sharded or not) with
`torch.load(weights_only=True)`: a pickle that would run code is refused (UnsafeCheckpointError)
before anything in it executes. Everything that is not a weight file (config.json, tokenizer files,
generation config) is copied as is.

GeGLU fix (`fix_geglu=True`). The GeGLU projection weights are the two input projections of a
GeGLU MLP, whose outputs meet in `gelu_tanh(gate) * up`: `mlp.gate_proj.weight` and
`mlp.up_proj.weight` of every layer of a GeGLU-family (gemma) checkpoint. `down_proj` (the output
projection) and everything else is left alone. Each row (one output feature, over the input
features) becomes `(w - mean) / (std + 1e-6)`, with `std` torch's default (Bessel-corrected,
correction=1), computed in float64 and cast back to the tensor's dtype.

Metadata written into the output (safetensors header, strings):
    fastllm.geglu_fix        "1" once the fix is applied (here or in an ancestor), else "0"
    fastllm.source_sha256    sha256 over the input weight files (sorted by name, bytes concatenated)
    fastllm.converted_from   "legacy" when the weights came from a torch pickle file (here or in an
                             earlier conversion), else "safetensors"
The fix is refused on an input whose metadata already says `fastllm.geglu_fix=1` unless `force`.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import save_file
from torch import Tensor

from runtime.errors import ConfigError, ModelLoadError
from runtime.models import quant_checkpoint
from runtime.models.bounds import check_layers
from runtime.models.checkpoint import open_checkpoint, safetensors_files
from runtime.models.config import ModelArgs
from runtime.models.loader import read_args
from runtime.models.quant import INT4_GROUP_SIZES, QuantReport
from runtime.models.quant_checkpoint import quantize_tensors
from runtime.models.side_files import resolved_inside

META_GEGLU_FIX = "fastllm.geglu_fix"
META_SOURCE_SHA256 = "fastllm.source_sha256"
META_CONVERTED_FROM = "fastllm.converted_from"
GEGLU_EPS = 1e-6
GEGLU_PROJECTIONS = ("gate_proj", "up_proj")
OUTPUT_FILE = "model.safetensors"
# files that hold weights (never copied; the output gets its own single model.safetensors)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


@dataclass(frozen=True)
class ConvertResult:
    output: Path  # the output directory
    converted_from: str  # "legacy" | "safetensors" | "gguf" (see the module docstring)
    source_sha256: str
    num_tensors: int
    fixed_tensors: tuple[str, ...]  # names the GeGLU fix rewrote in this run
    geglu_fix: bool  # metadata value written (True also when an ancestor applied it)
    quantization: tuple[QuantReport, ...] = ()  # per quantized projection, what it cost


def uses_geglu(args: ModelArgs) -> bool:
    return args.arch == "gemma"


def geglu_projection_names(args: ModelArgs) -> list[str]:
    """The checkpoint names the GeGLU fix applies to (empty for a non-GeGLU model)."""
    if not uses_geglu(args):
        return []
    return [
        f"model.layers.{i}.mlp.{proj}.weight"
        for i in range(args.num_layers)
        for proj in GEGLU_PROJECTIONS
    ]


def geglu_fix(weight: Tensor, eps: float = GEGLU_EPS) -> Tensor:
    """[out, in] -> per-row `(w - mean) / (std + eps)`, same dtype as `weight`."""
    w = weight.double()
    mean = w.mean(dim=-1, keepdim=True)
    std = w.std(dim=-1, keepdim=True)  # correction=1
    return ((w - mean) / (std + eps)).to(weight.dtype)


def source_sha256(files: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for file in sorted(files, key=lambda f: f.name):
        with file.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def weight_files(path: Path) -> list[Path]:
    files = safetensors_files(path)
    if files:
        return files
    return sorted(p for p in path.glob("*.bin") if p.name.startswith("pytorch_model"))


def convert_checkpoint(
    input_dir: str | Path,
    output_dir: str | Path,
    *,
    fix_geglu: bool = False,
    force: bool = False,
    on_tensor: Callable[[str, int, int], None] | None = None,
    quantize: str | None = None,
    group_size: int = 32,
) -> ConvertResult:
    """Convert `input_dir` into `output_dir` (created). `on_tensor(name, index, total)` reports
    progress. `quantize` (int8 | int4) stores the decoder projections quantized
    (runtime.models.quant_checkpoint). Raises ConfigError for a refused request,
    ModelLoadError / UnsafeCheckpointError for an unreadable input."""
    src, dst = Path(input_dir), Path(output_dir)
    if not src.is_dir():
        raise ConfigError(f"input {src} is not a directory", param="input")
    if dst.exists() and dst.resolve() == src.resolve():
        raise ConfigError("--output must differ from --input", param="output")
    for file in [*weight_files(src), *_side_files(src)]:  # before anything is read
        resolved_inside(src, file)
    args = read_args(src)
    source = open_checkpoint(src, legacy_support=True)  # weights_only=True for pickles
    check_layers(args.num_layers, source.names())  # what `serve` would refuse, refused here
    if (src / "tokenizer.json").is_file():  # its vocabulary and chat template, as serve checks
        from runtime.models.tokenizer import Tokenizer  # lazy: only for directories with one

        Tokenizer.from_dir(src)
    previous = source.metadata
    already_fixed = previous.get(META_GEGLU_FIX) == "1"
    targets = set(geglu_projection_names(args)) if fix_geglu else set()
    if fix_geglu and not targets:
        raise ConfigError(
            f"--fix-geglu: {args.architecture or args.arch} has no GeGLU projection weights "
            "(only GeGLU-family models such as gemma do)",
            param="fix_geglu",
        )
    if fix_geglu and already_fixed and not force:
        raise ConfigError(
            f"{src} already has the GeGLU fix applied ({META_GEGLU_FIX}=1); applying it twice "
            "changes the weights again. Pass --force to do it anyway.",
            param="fix_geglu",
        )
    missing = sorted(targets - set(source.names()))
    if missing:
        raise ModelLoadError(f"checkpoint has no tensor {missing[0]!r} for the GeGLU fix")
    is_legacy = source.is_legacy or previous.get(META_CONVERTED_FROM) == "legacy"
    metadata = {
        "format": "pt",
        META_GEGLU_FIX: "1" if (already_fixed or targets) else "0",
        META_SOURCE_SHA256: source_sha256(weight_files(src)),
        META_CONVERTED_FROM: "legacy" if is_legacy else "safetensors",
    }
    names = source.names()
    dst.mkdir(parents=True, exist_ok=True)  # before the work: an unwritable output fails first
    tensors: dict[str, Tensor] = {}
    fixed: list[str] = []
    reports: list[QuantReport] = []
    if quantize is not None:
        check_quantize(args, previous, quantize, group_size)

        def fixed_tensor(name: str) -> Tensor:
            tensor = source.get(name)
            return geglu_fix(tensor) if name in targets else tensor

        quantized, reports, replaced = quantize_tensors(
            args, fixed_tensor, quantize, group_size, on_tensor
        )
        tensors.update(quantized)
        names = [n for n in names if n not in replaced]
        fixed = sorted(targets & replaced)
        metadata.update(
            {
                quant_checkpoint.META_METHOD: quantize,
                quant_checkpoint.META_GROUP: str(group_size),
                quant_checkpoint.META_LAYOUT: quant_checkpoint.LAYOUT,
            }
        )
    for index, name in enumerate(names):
        tensor = source.get(name)
        if name in targets:
            tensor = geglu_fix(tensor)
            fixed.append(name)
        # clone: legacy state dicts may share storage (tied weights), which safetensors refuses
        tensors[name] = tensor.detach().to("cpu").contiguous().clone()
        if on_tensor is not None:
            on_tensor(name, index + 1, len(names))
    _copy_side_files(src, dst)
    partial = dst / (OUTPUT_FILE + ".partial")
    save_file(tensors, str(partial), metadata=metadata)
    partial.replace(dst / OUTPUT_FILE)  # the output never holds a half-written weight file
    return ConvertResult(
        output=dst,
        converted_from=metadata[META_CONVERTED_FROM],
        source_sha256=metadata[META_SOURCE_SHA256],
        num_tensors=len(tensors),
        fixed_tensors=tuple(fixed),
        geglu_fix=metadata[META_GEGLU_FIX] == "1",
        quantization=tuple(reports),
    )


def check_quantize(args: ModelArgs, metadata: dict[str, str], method: str, group: int) -> None:
    if args.arch == "bert":
        raise ConfigError("--quantize applies to causal LMs only", param="quantize")
    if metadata.get(quant_checkpoint.META_METHOD):
        raise ConfigError(
            f"the input is already quantized ({metadata[quant_checkpoint.META_METHOD]})",
            param="quantize",
        )
    if method not in ("int8", "int4"):
        raise ConfigError(f"--quantize takes int8 or int4, not {method!r}", param="quantize")
    if method == "int4" and group not in INT4_GROUP_SIZES:
        raise ConfigError(
            f"--group-size {group}: int4 takes one of {list(INT4_GROUP_SIZES)}", param="group_size"
        )


def _side_files(src: Path) -> list[Path]:
    """Everything `_copy_side_files` reads, the files inside copied folders included."""
    items = [i for i in sorted(src.iterdir()) if not _is_weight(i)]
    return [*items, *(f for i in items if i.is_dir() for f in sorted(i.rglob("*")))]


def _is_weight(item: Path) -> bool:
    return item.name in _WEIGHT_INDEXES or item.suffix in _WEIGHT_SUFFIXES


def _copy_side_files(src: Path, dst: Path) -> None:
    """config.json, tokenizer files and the rest; never weight files or their indexes."""
    for item in sorted(src.iterdir()):
        if _is_weight(item):
            continue
        target = dst / item.name
        if item.is_dir():
            shutil.copytree(item, target, dirs_exist_ok=True)
        elif item.is_file():
            shutil.copy2(item, target)
