"""Sane bounds on a checkpoint's declared shape, checked before anything is sized from it.

A header is data, not a promise: `num_hidden_layers = 2**31` (or GGUF `llama.block_count`) used to
build a weight table of 2**31 * 9 rows (~20 GB) before a single tensor was compared, and
`context_length = 2**32 - 1` loaded, then sized a rope table of 34 GB on the first request. Two
checks run first, for safetensors directories and GGUF files alike:

- `check_declared(cfg)`: each size against a limit well above every published model of the
  supported families (so a real file never trips it, and a lie is refused in one line);
- `check_layers(args, names)`: the declared layer count against the layer indices the checkpoint
  actually holds (one regex pass over the names; the weight table is built only after it).

Token ids (bos, eos, pad) must name rows of the embedding. Context lengths within the bound but
beyond what this server's KV pool holds are served up to the pool (the engine sizes its rope table
to the pool and refuses longer prompts with a 400): that is an operator's sizing choice, not a
broken file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from runtime.errors import ModelLoadError

# Largest in the wild for the supported families, for scale: layers 126 (Llama 3.1 405B),
# hidden 16384, heads 128, intermediate 53248, vocab 256000 (Gemma), context 4194304
# (Gradient's Llama 3 4M). Each bound leaves >= 4x headroom above those.
MAX_LAYERS = 1024
MAX_HIDDEN_SIZE = 1 << 17
MAX_HEADS = 4096
MAX_INTERMEDIATE_SIZE = 1 << 20
MAX_VOCAB_SIZE = 1 << 22
MAX_CONTEXT_POSITIONS = 1 << 24
MAX_HEAD_DIM = 4096

# config.json key -> its bound
LIMITS: dict[str, int] = {
    "num_hidden_layers": MAX_LAYERS,
    "hidden_size": MAX_HIDDEN_SIZE,
    "num_attention_heads": MAX_HEADS,
    "num_key_value_heads": MAX_HEADS,
    "intermediate_size": MAX_INTERMEDIATE_SIZE,
    "vocab_size": MAX_VOCAB_SIZE,
    "max_position_embeddings": MAX_CONTEXT_POSITIONS,
    "head_dim": MAX_HEAD_DIM,
    "type_vocab_size": MAX_VOCAB_SIZE,
}
_LAYER = re.compile(r"^(?:model\.layers|encoder\.layer)\.(\d+)\.")


def check_declared(cfg: dict[str, Any]) -> None:
    """Each declared size of a config.json-shaped dict within its bound (types are checked by
    ModelArgs itself: this only refuses integers too large to be true)."""
    for key, limit in LIMITS.items():
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            raise ModelLoadError(
                f"config.json: field {key!r} is {value}, beyond the {limit} this runtime accepts "
                "(a corrupt or hostile header: no real model of this family is that large)"
            )


def check_token_ids(cfg: dict[str, Any], vocab_size: int) -> None:
    """bos / eos / pad ids name rows of the embedding (an id past it would index nothing)."""
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = cfg.get(key)
        for token_id in value if isinstance(value, list) else [value]:
            if token_id is None:
                continue
            if isinstance(token_id, bool) or not isinstance(token_id, int):
                raise ModelLoadError(f"config.json: {key} {token_id!r} is not an integer")
            if token_id >= vocab_size or (token_id < 0 and key != "pad_token_id"):
                raise ModelLoadError(
                    f"config.json: {key} {token_id} is not a token id (vocab_size {vocab_size})"
                )


def check_layers(num_layers: int, names: Iterable[str]) -> None:
    """The declared layer count against the layers the checkpoint holds tensors for."""
    present = {int(m.group(1)) for n in names if (m := _LAYER.match(n))}
    if num_layers > len(present):
        raise ModelLoadError(
            f"config.json: field 'num_hidden_layers' is {num_layers}, the checkpoint holds "
            f"tensors for {len(present)} layers"
        )
