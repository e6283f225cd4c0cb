"""GGUF metadata -> the HF `config.json` dict that `ModelArgs.from_hf_config` already validates.

Going through the HF dict keeps one set of checks (positive sizes, heads divisible by kv heads,
rope types) for both checkpoint formats. Keys are llama.cpp's `{arch}.*` names.
"""

from __future__ import annotations

from typing import Any

from runtime.errors import ModelLoadError
from runtime.models.bounds import check_layers
from runtime.models.config import ModelArgs
from runtime.models.gguf_io.reader import GGUFFile
from runtime.models.gguf_io.source import hf_name

# GGUF general.architecture -> HF class name. Both rope-rotate like HF once llama's q/k rows are
# un-permuted (names.py); qwen2 files were never permuted.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# spare embedding rows beyond the token list that padding explains (see check_vocabulary)
MAX_PADDING_ROWS = 128
# `{arch}.<key>` -> config.json key
_KEYS = {
    "embedding_length": "hidden_size",
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "feed_forward_length": "intermediate_size",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "context_length": "max_position_embeddings",
    "vocab_size": "vocab_size",
    "attention.key_length": "head_dim",
}


def hf_config(file: GGUFFile) -> dict[str, Any]:
    arch = file.architecture
    if arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"{file.path}: unsupported GGUF architecture {arch or '(none)'!r}; "
            f"supported: {', '.join(ARCHITECTURES)}"
        )
    cfg: dict[str, Any] = {"architectures": [ARCHITECTURES[arch]], "model_type": arch}
    for key, hf_key in _KEYS.items():
        value = file.get(f"{arch}.{key}")
        if value is not None:
            cfg[hf_key] = value
    tokens = file.get("tokenizer.ggml.tokens")
    if "vocab_size" not in cfg and isinstance(tokens, list):  # older files: only the token list
        cfg["vocab_size"] = len(tokens)
    # llama.cpp writes no `output.weight` when the head shares the embedding
    cfg["tie_word_embeddings"] = "output.weight" not in file.tensors
    cfg["attention_bias"] = arch == "llama" and "blk.0.attn_output.bias" in file.tensors
    rope_dims = file.get(f"{arch}.rope.dimension_count")
    head_dim = cfg.get("head_dim")
    if rope_dims is not None and head_dim is not None and rope_dims != head_dim:
        raise ModelLoadError(f"{file.path}: partial rotary embeddings are not supported")
    for key in ("bos", "eos", "padding"):
        value = file.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None:
            cfg["pad_token_id" if key == "padding" else f"{key}_token_id"] = int(value)
    scaling = file.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        cfg["rope_scaling"] = {"rope_type": scaling}  # refused by ModelArgs with its message
    return cfg


def check_vocabulary(file: GGUFFile, num_tokens: int, vocab_size: int) -> None:
    """The tokenizer's list against the embedding rows it indexes: never more tokens than rows,
    and no more spare rows than padding explains (converters round the embedding up, to a
    multiple of 64..1024: Qwen2 holds 151,646 tokens in 152,064 rows, 418 spare of the 2,376
    allowed by rows / 64)."""
    where = f"{file.path}: tokenizer.ggml.tokens has {num_tokens} tokens"
    if num_tokens == 0:
        raise ModelLoadError(f"{where}; a model needs a vocabulary")
    if num_tokens > vocab_size:
        raise ModelLoadError(f"{where}, more than the {vocab_size} rows of the embedding")
    if vocab_size - num_tokens > max(MAX_PADDING_ROWS, vocab_size // 64):
        raise ModelLoadError(
            f"{where} for {vocab_size} embedding rows (more spare rows than padding explains)"
        )


def model_args(file: GGUFFile) -> ModelArgs:
    try:
        args = ModelArgs.from_hf_config(hf_config(file))
        check_layers(args.num_layers, [n for n in map(hf_name, file.tensors) if n is not None])
        tokens = file.get("tokenizer.ggml.tokens")
        if isinstance(tokens, list):
            check_vocabulary(file, len(tokens), args.vocab_size)
        return args
    except ModelLoadError as exc:
        if str(file.path) in exc.message:
            raise
        # ModelArgs speaks of config.json and its keys; here the values came from GGUF metadata
        message = exc.message.replace("config.json", "GGUF metadata")
        for hf_key, gguf_key in _gguf_keys(file.architecture).items():
            message = message.replace(f"{hf_key!r}", repr(gguf_key))
            message = message.replace(f"{hf_key} ", f"{gguf_key} ")
        raise ModelLoadError(f"{file.path}: {message}") from exc


def _gguf_keys(arch: str) -> dict[str, str]:
    """config.json key -> the GGUF key it was read from (for messages)."""
    keys = {hf: f"{arch}.{key}" for key, hf in _KEYS.items()}
    for token in ("bos", "eos"):
        keys[f"{token}_token_id"] = f"tokenizer.ggml.{token}_token_id"
    keys["pad_token_id"] = "tokenizer.ggml.padding_token_id"
    return keys
