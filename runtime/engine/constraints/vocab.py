"""The tokenizer's vocabulary as XGrammar wants it (`TokenizerInfo`), built once per loaded model.

The vocabulary is the raw token strings by id; how they map to bytes is the tokenizer's decoder
(tokenizer.json): a ByteLevel decoder (GPT-2 style, our demo tokenizers, SmolLM2) is BYTE_LEVEL,
a ByteFallback step (Llama/Gemma SentencePiece conversions) is BYTE_FALLBACK, anything else RAW.
Special tokens are never text (they are skipped when decoding a response); eos ends the grammar.
The model's vocab_size may exceed the tokenizer's (padded embedding rows): those ids are never
allowed by a mask.
"""

from __future__ import annotations

import json
from typing import Any

import xgrammar as xgr

from runtime.models.tokenizer import Tokenizer

__all__ = ["tokenizer_info", "vocab_type"]


def vocab_type(decoder: dict[str, Any] | None) -> xgr.VocabType:
    """From tokenizer.json's `decoder` entry."""
    if not decoder:
        return xgr.VocabType.RAW
    steps = decoder.get("decoders") if decoder.get("type") == "Sequence" else [decoder]
    types = {step.get("type") for step in steps or () if isinstance(step, dict)}
    if "ByteLevel" in types:
        return xgr.VocabType.BYTE_LEVEL
    if "ByteFallback" in types:
        return xgr.VocabType.BYTE_FALLBACK
    return xgr.VocabType.RAW


def tokenizer_info(tokenizer: Tokenizer, model_vocab_size: int) -> xgr.TokenizerInfo:
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
    encoded = [""] * model_vocab_size
    for token, index in vocab.items():
        if index < model_vocab_size:
            encoded[index] = token
    # special tokens (<s>, <pad>, ...) decode to nothing in a response (skip_special_tokens), so
    # they must not count as text a grammar accepts: XGrammar takes an empty entry as special
    for index, added in tokenizer.backend.get_added_tokens_decoder().items():
        if added.special and index < model_vocab_size:
            encoded[index] = ""
    decoder = json.loads(tokenizer.backend.to_str()).get("decoder")
    return xgr.TokenizerInfo(
        encoded,
        vocab_type(decoder),
        vocab_size=model_vocab_size,
        stop_token_ids=list(tokenizer.eos_token_ids),
    )
