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
import re
from typing import TYPE_CHECKING, Any

from runtime.models.tokenizer import Tokenizer

if TYPE_CHECKING:  # XGrammar is imported where it is used: it pulls in transformers (~0.8 s)
    import xgrammar as xgr

__all__ = ["tokenizer_info", "vocab_type"]

_CONTROL = re.compile(rb"[\x00-\x09\x0b\x0c\x0e-\x1f]")


def vocab_type(decoder: dict[str, Any] | None) -> xgr.VocabType:
    """From tokenizer.json's `decoder` entry."""
    import xgrammar as xgr

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
    import xgrammar as xgr

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
    kind = vocab_type(decoder)
    info = xgr.TokenizerInfo(
        encoded, kind, vocab_size=model_vocab_size, stop_token_ids=list(tokenizer.eos_token_ids)
    )
    # XGrammar 0.2.9 lets a JSON string with maxLength take raw control characters, which JSON
    # forbids (json.loads and pydantic refuse them): tokens holding one (all but \n and \r, which
    # it excludes itself) are never text under a constraint
    stops = set(tokenizer.eos_token_ids)
    banned = {i for i, b in enumerate(info.decoded_vocab) if i not in stops and _CONTROL.search(b)}
    if not banned:
        return info
    for index in banned:
        encoded[index] = ""
    return xgr.TokenizerInfo(
        encoded, kind, vocab_size=model_vocab_size, stop_token_ids=list(tokenizer.eos_token_ids)
    )
