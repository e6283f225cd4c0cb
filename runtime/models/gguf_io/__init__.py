"""GGUF checkpoints (llama.cpp's format) as a checkpoint source beside safetensors.

file = open_gguf(path)                 # metadata + packed tensors, sizes checked (reader.py)
args = model_args(file)                # llama / qwen2 metadata -> ModelArgs (args.py)
source = GGUFSource(file, args)        # HF names, dequantized, rope rows restored (source.py)
tokenizer = load_gguf_tokenizer(file)  # tokenizer.ggml.* + chat template (tokenizer.py)
"""

from __future__ import annotations

from pathlib import Path

from runtime.models.gguf_io.args import hf_config, model_args
from runtime.models.gguf_io.reader import GGUFFile, GGUFTensor, dequantize, is_gguf, open_gguf
from runtime.models.gguf_io.source import GGUFSource, hf_name, unpair_rope_rows
from runtime.models.gguf_io.tokenizer import (
    gguf_tokenizer,
    load_gguf_tokenizer,
    tokenizer_config_json,
)

__all__ = [
    "GGUFFile",
    "GGUFSource",
    "GGUFTensor",
    "check_gguf",
    "dequantize",
    "gguf_tokenizer",
    "hf_config",
    "hf_name",
    "is_gguf",
    "load_gguf_tokenizer",
    "model_args",
    "open_gguf",
    "tokenizer_config_json",
    "unpair_rope_rows",
]


def check_gguf(path: str | Path) -> GGUFFile:
    """Everything about a GGUF file that can be checked without dequantizing: header and sizes,
    architecture and shapes, tensor names and types, tokenizer metadata. Seconds at most (the
    file is memory-mapped), so `fastllm serve` runs it before starting the server."""
    from runtime.models.loader import check_tensors

    file = open_gguf(path)
    args = model_args(file)
    check_tensors(args, GGUFSource(file, args))
    load_gguf_tokenizer(file)  # the vocabulary, and the chat template on a sample conversation
    return file
