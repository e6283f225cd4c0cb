"""GGUF metadata -> the HF `config.json` dict that `ModelArgs.from_hf_config` already validates.

Going through the HF dict keeps one set of checks (positive sizes, heads divisible by kv heads,
rope types) for both checkpoint formats. Keys are llama.cpp's `{arch}.*` names.
"""

from __future__ import annotations

from typing import Any

from runtime.errors import ModelLoadError
from runtime.models.config import ModelArgs
from runtime.models.gguf_io.reader import GGUFFile

# GGUF general.architecture -> HF class name. Both rope-rotate like HF once llama's q/k rows are
# un-permuted (names.py); qwen2 files were never permuted.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
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
    if "vocab_size" not in cfg:  # older files: the vocab is only in the tokenizer list
        tokens = file.get("tokenizer.ggml.tokens")
        if isinstance(tokens, list):
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


def model_args(file: GGUFFile) -> ModelArgs:
    try:
        return ModelArgs.from_hf_config(hf_config(file))
    except ModelLoadError as exc:
        if str(file.path) in exc.message:
            raise
        # ModelArgs speaks of config.json; here the values came from the GGUF metadata
        message = exc.message.replace("config.json", "GGUF metadata")
        raise ModelLoadError(f"{file.path}: {message}") from exc
