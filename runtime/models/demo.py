"""Demo checkpoints: random weights in HuggingFace layout (config.json + model.safetensors,
written by `transformers` save_pretrained) plus a BPE tokenizer trained on our own corpus.

    tiny   hidden 64, 2 layers, vocab 512          (tests; builds in about a second)
    small  llama: hidden 512, 8 layers, 8 heads / 4 KV heads, intermediate 1376, vocab 32000
           (~56M parameters; the benchmark model). The corpus yields far fewer than 32000 BPE
           entries; the tokenizer's vocabulary is filled up to 32000 with corpus word pieces that
           BPE never produces (demo_tokenizer.cover_vocab): encoding is as trained, and every id
           the model emits decodes to text.

Same arch/size/seed -> byte-identical weights and tokenizer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from runtime.errors import ConfigError
from runtime.models.demo_tokenizer import (
    SPECIAL_TOKENS,
    cover_vocab,
    save_demo_tokenizer,
    train_demo_tokenizer,
)

__all__ = ["ARCHS", "SIZES", "demo_config", "make_demo_model"]

ARCHS = ("llama", "gemma", "bert")
SIZES = ("tiny", "small")

# shape of each (arch, size); vocab_size is what the model gets, the tokenizer trains up to it
_SHAPES: dict[tuple[str, str], dict[str, Any]] = {
    ("llama", "tiny"): dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    ("llama", "small"): dict(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
    ),
    # gemma: head_dim deliberately != hidden / heads, as in the real family
    ("gemma", "tiny"): dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
    ),
    ("gemma", "small"): dict(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=128,
    ),
    ("bert", "tiny"): dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
    ),
    ("bert", "small"): dict(
        vocab_size=32000,
        hidden_size=384,
        intermediate_size=1536,
        num_hidden_layers=6,
        num_attention_heads=12,
    ),
}


def demo_config(arch: str, size: str) -> Any:
    """The `transformers` config object of a demo model."""
    from transformers import BertConfig, GemmaConfig, LlamaConfig

    if (arch, size) not in _SHAPES:
        raise ConfigError(f"unknown demo model {arch}/{size}; arch: {ARCHS}, size: {SIZES}")
    shape = _SHAPES[(arch, size)]
    ids = {role: i for i, role in enumerate(SPECIAL_TOKENS[arch].specials)}
    if arch == "bert":
        return BertConfig(**shape, max_position_embeddings=512, pad_token_id=ids["[PAD]"])
    specials = SPECIAL_TOKENS[arch].config
    common = dict(
        **shape,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=ids[specials["bos_token"]],
        eos_token_id=ids[specials["eos_token"]],
        pad_token_id=ids[specials["pad_token"]],
    )
    if arch == "llama":
        return LlamaConfig(**common, tie_word_embeddings=False)
    return GemmaConfig(**common, hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True)


@contextlib.contextmanager
def _steps(enabled: bool) -> Iterator[Any]:
    """A rich progress display on stderr; `step(label)` starts the next stage."""
    if not enabled:
        yield lambda label: None
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        current: list[Any] = []

        def step(label: str) -> None:
            if current:
                progress.update(current[-1], completed=1, total=1)
            current.append(progress.add_task(label, total=None))

        yield step
        if current:
            progress.update(current[-1], completed=1, total=1)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """save_pretrained draws its own tqdm bar on stderr; ours is the only progress shown."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def make_demo_model(
    path: str | Path,
    *,
    arch: str = "llama",
    size: str = "tiny",
    seed: int = 0,
    progress: bool = False,
    overrides: dict[str, Any] | None = None,
) -> Path:
    """Write a random-weight checkpoint to `path` (created if absent) and return it.
    `overrides` sets config fields after the preset (tests: e.g. an untied gemma)."""
    from transformers import BertModel, GemmaForCausalLM, LlamaForCausalLM

    config = demo_config(arch, size)
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model_cls = {"llama": LlamaForCausalLM, "gemma": GemmaForCausalLM, "bert": BertModel}[arch]
    with _steps(progress) as step:
        step(f"training the BPE tokenizer (up to {config.vocab_size} entries)")
        tok = cover_vocab(train_demo_tokenizer(arch, config.vocab_size), config.vocab_size)
        save_demo_tokenizer(tok, arch, path, max_length=config.max_position_embeddings)
        step(f"initialising {arch}/{size} weights (seed {seed})")
        # fork_rng: the caller's global RNG state is left as it was
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = model_cls(config).eval()
        step(f"saving to {path}")
        with _quiet_transformers():
            model.save_pretrained(path, safe_serialization=True)
    return path
