"""make_demo_model: HF-loadable, deterministic per seed, family-specific special tokens."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.errors import ConfigError
from runtime.models.demo import demo_config, make_demo_model
from runtime.models.tokenizer import Tokenizer


def _digest(path: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_same_seed_same_files_other_seed_other_weights(
    demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    first = demo_model_dir("llama")
    assert _digest(make_demo_model(tmp_path / "again", arch="llama", seed=0)) == _digest(first)
    other = _digest(make_demo_model(tmp_path / "other", arch="llama", seed=1))
    assert other["model.safetensors"] != _digest(first)["model.safetensors"]
    assert other["tokenizer.json"] == _digest(first)["tokenizer.json"]


@pytest.mark.parametrize("arch", ["llama", "gemma", "bert"])
def test_transformers_loads_the_demo(arch: str, demo_model_dir: Callable[[str], Path]) -> None:
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    path = demo_model_dir(arch)
    config = AutoConfig.from_pretrained(path)
    model = AutoModel.from_pretrained(path)  # strict enough: missing weights would be re-inited
    assert sum(p.numel() for p in model.parameters()) > 0
    assert config.vocab_size == 512
    ours = Tokenizer.from_dir(path)
    ref = AutoTokenizer.from_pretrained(path)
    text = "Prefill reads the prompt once."
    assert ours.encode(text) == ref(text)["input_ids"]
    if arch == "bert":
        assert ours.decode(ours.encode(text), skip_special_tokens=False).startswith("[CLS]")
        assert ref.convert_ids_to_tokens(ours.encode(text))[-1] == "[SEP]"
    else:
        assert ours.encode(text)[0] == config.bos_token_id
        assert ours.eos_token_ids == (config.eos_token_id,)


def test_small_llama_shape() -> None:
    config = demo_config("llama", "small")
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (512, 8, 8)
    assert (config.num_key_value_heads, config.intermediate_size, config.vocab_size) == (
        4,
        1376,
        32000,
    )
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        num_params = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    assert 55e6 < num_params < 57e6
    with pytest.raises(ConfigError):
        demo_config("llama", "huge")
