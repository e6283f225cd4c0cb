"""Tiny random-weight HuggingFace checkpoints for tests (importable by any test module).

    from tests.runtime.models.builders import build_llama, build_gemma, build_bert, hf_model

Each `build_*` writes `config.json` + `model.safetensors` (transformers config/model classes,
`save_pretrained(safe_serialization=True)`) and, unless `tokenizer=False`, a byte-level BPE
`tokenizer.json` + `tokenizer_config.json` (runtime.models.demo_tokenizer) whose special-token ids
match the config. Returns the directory. Keyword overrides go to the transformers config class.
1-D parameters (norm weights, biases) are perturbed away from their 0/1 init so a test notices a
wrong norm offset or a dropped bias. `hf_model(path)` loads the transformers reference in fp32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from runtime.models.demo_tokenizer import SPECIAL_TOKENS, save_demo_tokenizer, train_demo_tokenizer

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2)


def _special_ids(family: str) -> dict[str, int]:
    spec = SPECIAL_TOKENS[family]
    ids = {tok: i for i, tok in enumerate(spec.specials)}
    roles = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "pad_token": "pad_token_id"}
    return {roles[r]: ids[t] for r, t in spec.config.items() if r in roles}


def _save(model: Any, path: str | Path, family: str, tokenizer: bool, seed: int) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed + 1)
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(0.1 * torch.randn(param.shape, generator=gen))
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer:
        tok = train_demo_tokenizer(family, model.config.vocab_size)
        save_demo_tokenizer(tok, family, path, max_length=model.config.max_position_embeddings)
    return path


def _init(cls: Any, config: Any, seed: int) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(config).eval()


def build_llama(
    path: str | Path,
    *,
    vocab_size: int = 320,
    num_attention_heads: int = 8,
    num_key_value_heads: int = 2,  # GQA 4:1
    rope_theta: float = 500000.0,
    tie_word_embeddings: bool = False,
    seed: int = 0,
    tokenizer: bool = True,
    **overrides: Any,
) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        **{**TINY, **_special_ids("llama"), **overrides},
        vocab_size=vocab_size,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings=tie_word_embeddings,
    )
    return _save(_init(LlamaForCausalLM, config, seed), path, "llama", tokenizer, seed)


def build_qwen2(
    path: str | Path, *, seed: int = 0, tokenizer: bool = True, **overrides: Any
) -> Path:
    """Qwen2 layout: biases on q/k/v, none on o_proj."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **{**TINY, **_special_ids("llama"), **overrides},
        vocab_size=overrides.pop("vocab_size", 320),
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    return _save(_init(Qwen2ForCausalLM, config, seed), path, "llama", tokenizer, seed)


def build_gemma(
    path: str | Path,
    *,
    vocab_size: int = 320,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 1,
    head_dim: int = 32,  # != hidden 64 / 4 heads
    seed: int = 0,
    tokenizer: bool = True,
    **overrides: Any,
) -> Path:
    from transformers import GemmaConfig, GemmaForCausalLM

    config = GemmaConfig(
        **{**TINY, **_special_ids("gemma"), **overrides},
        vocab_size=vocab_size,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        hidden_act="gelu_pytorch_tanh",
    )
    return _save(_init(GemmaForCausalLM, config, seed), path, "gemma", tokenizer, seed)


def build_bert(
    path: str | Path,
    *,
    vocab_size: int = 320,
    num_attention_heads: int = 4,
    seed: int = 0,
    tokenizer: bool = True,
    **overrides: Any,
) -> Path:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        **{**TINY, "max_position_embeddings": 128, **overrides},
        vocab_size=vocab_size,
        num_attention_heads=num_attention_heads,
        pad_token_id=0,
    )
    return _save(_init(BertModel, config, seed), path, "bert", tokenizer, seed)


def to_legacy(path: str | Path) -> Path:
    """Rewrite a built checkpoint as `pytorch_model.bin` only (what old checkpoints look like)."""
    from safetensors.torch import load_file

    path = Path(path)
    state = load_file(path / "model.safetensors")
    torch.save(state, path / "pytorch_model.bin")
    (path / "model.safetensors").unlink()
    return path


def hf_model(path: str | Path) -> Any:
    """The transformers reference for a built checkpoint, fp32, eval mode."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    cls = AutoModel if config.model_type == "bert" else AutoModelForCausalLM
    return cls.from_pretrained(path, dtype=torch.float32).eval()
