"""`ModelArgs`: the one description of a model's shape, read from a HuggingFace `config.json`.

Supported `architectures` map to one of three families (`arch`): "llama" (Llama, Mistral, Qwen2),
"gemma" and "bert". Both RoPE config forms are read: transformers 5 writes
`rope_parameters: {"rope_theta", "rope_type"}`, older files a top-level `rope_theta`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from runtime.errors import ModelLoadError
from runtime.models.bounds import check_declared, check_token_ids

# HF class name -> family. The order is what error messages list.
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "GemmaForCausalLM": "gemma",
    "BertModel": "bert",
}


@dataclass(frozen=True)
class ModelArgs:
    arch: str  # "llama" | "gemma" | "bert"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # independent of hidden_size / num_heads (gemma)
    intermediate_size: int
    norm_eps: float
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"  # gate activation (llama: silu, gemma: gelu tanh) or bert's FFN act
    qkv_bias: bool = False  # Qwen2 / Llama attention_bias
    o_bias: bool = False  # Llama attention_bias (Qwen2 has none on o_proj)
    mlp_bias: bool = False
    type_vocab_size: int = 0  # bert token types
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    architecture: str = ""  # the HF class name it came from

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_causal_lm(self) -> bool:
        return self.arch != "bert"

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelArgs:
        if not isinstance(cfg, dict):
            raise ModelLoadError("config.json must hold a JSON object")
        archs = cfg.get("architectures") or []
        if not isinstance(archs, list) or not archs:
            raise ModelLoadError(f"config.json has no 'architectures'; supported: {_supported()}")
        name = next((a for a in archs if a in ARCHITECTURES), None)
        if name is None:
            raise ModelLoadError(
                f"unsupported architecture {archs[0]!r}; supported: {_supported()}"
            )
        arch = ARCHITECTURES[name]
        check_declared(cfg)  # before anything is sized from the header
        hidden = _int(cfg, "hidden_size")
        heads = _int(cfg, "num_attention_heads")
        kv_heads = _int(cfg, "num_key_value_heads", default=heads)
        head_dim = cfg.get("head_dim") or hidden // heads
        if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
            raise ModelLoadError(f"config.json: invalid head_dim {head_dim!r}")
        if heads % kv_heads:
            raise ModelLoadError(f"config.json: {heads} heads not divisible by {kv_heads} kv heads")
        if cfg.get("head_dim") is None and hidden % heads:
            raise ModelLoadError(
                f"config.json: hidden_size {hidden} not divisible by {heads} heads"
            )
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        attention_bias = bool(cfg.get("attention_bias", False))
        vocab_size = _int(cfg, "vocab_size")
        check_token_ids(cfg, vocab_size)
        return cls(
            arch=arch,
            vocab_size=vocab_size,
            hidden_size=hidden,
            num_layers=_int(cfg, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=_int(cfg, "intermediate_size"),
            norm_eps=float(cfg.get("layer_norm_eps" if arch == "bert" else "rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(cfg) if arch != "bert" else 0.0,
            max_position_embeddings=_int(cfg, "max_position_embeddings", default=2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", arch == "gemma")),
            hidden_act=_hidden_act(arch, cfg),
            qkv_bias=arch == "bert" or attention_bias or name == "Qwen2ForCausalLM",
            o_bias=arch == "bert" or attention_bias,
            mlp_bias=arch == "bert" or bool(cfg.get("mlp_bias", False)),
            type_vocab_size=_int(cfg, "type_vocab_size", default=2) if arch == "bert" else 0,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            pad_token_id=cfg.get("pad_token_id"),
            architecture=name,
        )


def _supported() -> str:
    return ", ".join(ARCHITECTURES)


def _int(cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ModelLoadError(f"config.json: missing required field {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadError(
            f"config.json: field {key!r} must be a positive integer, got {value!r}"
        )
    return value


def _rope_theta(cfg: dict[str, Any]) -> float:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default")) if params else "default"
    if rope_type not in ("default", None):
        raise ModelLoadError(
            f"config.json: rope_type {rope_type!r} is not supported (only default)"
        )
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if not isinstance(theta, int | float) or not math.isfinite(theta) or theta <= 0:
        raise ModelLoadError(f"config.json: invalid rope_theta {theta!r}")
    return float(theta)


def _hidden_act(arch: str, cfg: dict[str, Any]) -> str:
    if arch == "gemma":
        return "gelu_pytorch_tanh"  # Gemma's GeGLU always uses the tanh approximation
    act = cfg.get("hidden_act", "gelu" if arch == "bert" else "silu")
    allowed = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu") if arch == "bert" else ("silu",)
    if act not in allowed:
        raise ModelLoadError(f"config.json: hidden_act {act!r} is not supported for {arch}")
    return str(act)
