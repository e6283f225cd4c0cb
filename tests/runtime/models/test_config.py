"""ModelArgs.from_hf_config: both RoPE config forms, family defaults, validation."""

from __future__ import annotations

import pytest

from runtime.errors import ModelLoadError
from runtime.models import ModelArgs

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
}


def args(**changes) -> ModelArgs:
    return ModelArgs.from_hf_config({**BASE, **changes})


def test_rope_theta_in_rope_parameters_v5() -> None:
    assert args(rope_parameters={"rope_type": "default", "rope_theta": 500000.0}).rope_theta == 5e5


def test_rope_theta_top_level_v4() -> None:
    assert args(rope_theta=1e6, rope_scaling=None).rope_theta == 1e6
    assert args().rope_theta == 10000.0


def test_unsupported_rope_type_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="llama3"):
        args(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0})


def test_head_dim_defaults_and_null() -> None:
    assert args().head_dim == 8
    assert args(head_dim=None).head_dim == 8  # Mistral configs write null
    assert args(head_dim=32).head_dim == 32


def test_family_flags() -> None:
    assert args().qkv_bias is False and args().tie_word_embeddings is False
    qwen = args(architectures=["Qwen2ForCausalLM"])
    assert qwen.qkv_bias and not qwen.o_bias
    assert args(attention_bias=True).o_bias
    gemma = args(architectures=["GemmaForCausalLM"], hidden_act="gelu")
    assert gemma.arch == "gemma" and gemma.tie_word_embeddings
    assert gemma.hidden_act == "gelu_pytorch_tanh"
    assert args(eos_token_id=[2, 7]).eos_token_ids == (2, 7)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"architectures": []}, "no 'architectures'"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"vocab_size": "100"}, "vocab_size"),
        ({"num_key_value_heads": 3}, "not divisible"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_invalid_configs(changes: dict, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        args(**changes)
