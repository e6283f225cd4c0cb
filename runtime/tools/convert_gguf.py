"""`fastllm convert --input FILE.gguf --output DIR`: a GGUF file -> an HF-layout directory.

The output (config.json, model.safetensors in float32, tokenizer.json, tokenizer_config.json with
the chat template) loads like any checkpoint directory, without dequantizing at every start.
float32 because a dequantized block value (fp16 scale * int + fp16 offset) is exact in it and not
in bf16/fp16: the served weights stay exactly the GGUF's. Provenance in the safetensors metadata:
    fastllm.converted_from   "gguf"
    fastllm.gguf_file        the input's file name
    fastllm.gguf_types       GGML type counts, e.g. "Q8_0:1,F32:61,Q4_1:210" (its quantization)
    fastllm.source_sha256    sha256 of the GGUF file
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from safetensors.torch import save_file
from torch import Tensor

from runtime.errors import ConfigError
from runtime.models.gguf_io import (
    GGUFSource,
    gguf_tokenizer,
    hf_config,
    load_gguf_tokenizer,
    model_args,
    open_gguf,
    tokenizer_config_json,
)
from runtime.models.loader import check_tensors
from runtime.tools.convert import (
    META_CONVERTED_FROM,
    META_SOURCE_SHA256,
    OUTPUT_FILE,
    ConvertResult,
    source_sha256,
)

META_GGUF_FILE = "fastllm.gguf_file"
META_GGUF_TYPES = "fastllm.gguf_types"


def convert_gguf(
    src: str | Path,
    dst: str | Path,
    *,
    on_tensor: Callable[[str, int, int], None] | None = None,
) -> ConvertResult:
    """`src` (a .gguf file) into `dst` (created). `on_tensor(name, index, total)` reports
    progress. Raises ModelLoadError for an unreadable or unsupported file."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and not dst.is_dir():
        raise ConfigError(f"--output {dst} exists and is not a directory", param="output")
    file = open_gguf(src)
    args = model_args(file)
    backend, tok_config = gguf_tokenizer(file)  # a bad vocabulary fails before the slow part
    load_gguf_tokenizer(file)  # and a chat template that cannot render: what serve refuses
    source = GGUFSource(file, args)
    names = source.names()
    check_tensors(args, source)  # every name and shape, before the slow part
    tensors: dict[str, Tensor] = {}
    for index, name in enumerate(names):
        tensors[name] = source.get(name).contiguous()  # float32, rope rows restored
        if on_tensor is not None:
            on_tensor(name, index + 1, len(names))
    metadata = {
        "format": "pt",
        META_CONVERTED_FROM: "gguf",
        META_GGUF_FILE: src.name,
        META_GGUF_TYPES: ",".join(f"{k}:{v}" for k, v in file.tensor_types.items()),
        META_SOURCE_SHA256: source_sha256([src]),
    }
    config = {**hf_config(file), "torch_dtype": "float32", "gguf_source": src.name}
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    backend.save(str(dst / "tokenizer.json"))
    (dst / "tokenizer_config.json").write_text(tokenizer_config_json(tok_config) + "\n")
    partial = dst / (OUTPUT_FILE + ".partial")
    save_file(tensors, str(partial), metadata=metadata)
    partial.replace(dst / OUTPUT_FILE)  # the output never holds a half-written weight file
    return ConvertResult(
        output=dst,
        converted_from="gguf",
        source_sha256=metadata[META_SOURCE_SHA256],
        num_tensors=len(tensors),
        fixed_tensors=(),
        geglu_fix=False,
    )
