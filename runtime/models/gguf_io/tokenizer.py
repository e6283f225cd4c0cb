"""`tokenizer.ggml.*` metadata -> a `tokenizers` tokenizer + the tokenizer_config.json dict.

Built the way transformers builds it from the same file (`gguf_file=`), so ids match:
- "gpt2" (byte-level BPE: SmolLM, Qwen2, Llama 3): the vocab and merges as a BPE model behind the
  GPT-2 byte-level pre-tokenizer and decoder. llama.cpp also records a pre-tokenizer regex family
  (`tokenizer.ggml.pre`), which transformers ignores; so do we, to stay id-identical with it.
- control (type 3) and user-defined (type 4) tokens become added tokens, matched before BPE;
  control tokens are special (skipped when decoding).
SentencePiece-style llama vocabularies ("llama") are refused with a one-line error for now.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors

from runtime.errors import ModelLoadError
from runtime.models.gguf_io.reader import GGUFFile

if TYPE_CHECKING:
    from runtime.models.tokenizer import Tokenizer

_CONTROL, _USER_DEFINED = 3, 4


def gguf_tokenizer(file: GGUFFile) -> tuple[tokenizers.Tokenizer, dict[str, Any]]:
    """The backend tokenizer and a tokenizer_config.json-shaped dict (special tokens, template)."""
    tokens = _checked_tokens(file)
    merges = [tuple(m.split(" ", 1)) for m in file.get("tokenizer.ggml.merges") or []]
    if any(len(m) != 2 for m in merges):
        raise ModelLoadError(f"{file.path}: malformed tokenizer.ggml.merges entry")
    vocab = {token: i for i, token in enumerate(tokens)}
    try:
        backend = tokenizers.Tokenizer(
            models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False)
        )
    except Exception as exc:  # the Rust side rejects merges naming unknown tokens
        raise ModelLoadError(f"{file.path}: invalid BPE vocabulary ({exc})") from exc
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    types = file.get("tokenizer.ggml.token_type") or []
    if not isinstance(types, list) or len(types) > len(tokens):
        raise ModelLoadError(
            f"{file.path}: tokenizer.ggml.token_type lists more types than there are tokens"
        )
    added = [
        AddedToken(tokens[i], special=kind_ == _CONTROL, normalized=False)
        for i, kind_ in enumerate(types)
        if kind_ in (_CONTROL, _USER_DEFINED)
    ]
    backend.add_tokens(added)

    def token(key: str) -> str | None:
        index = file.get(f"tokenizer.ggml.{key}_token_id")
        if index is None:
            return None
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(tokens):
            raise ModelLoadError(
                f"{file.path}: tokenizer.ggml.{key}_token_id {index!r} is not a token id "
                f"(the vocabulary has {len(tokens)} tokens)"
            )
        return str(tokens[index])

    bos = token("bos")
    if file.get("tokenizer.ggml.add_bos_token") and bos is not None:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B:1", special_tokens=[(bos, vocab[bos])]
        )
    config = {
        "bos_token": bos,
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "unk_token": token("unknown"),
        "chat_template": file.get("tokenizer.chat_template"),
        "model_max_length": file.get(f"{file.architecture}.context_length"),
    }
    return backend, {k: v for k, v in config.items() if v is not None}


def _checked_tokens(file: GGUFFile) -> list[str]:
    """The token list of a supported tokenizer; each refusal says what is wrong, and only that."""
    kind = file.get("tokenizer.ggml.model")
    if kind != "gpt2":
        found = "no tokenizer.ggml.model" if kind is None else f"tokenizer model {kind!r}"
        raise ModelLoadError(f"{file.path}: GGUF {found}; supported: 'gpt2' (byte-level BPE)")
    tokens = file.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ModelLoadError(f"{file.path}: GGUF tokenizer has no tokenizer.ggml.tokens list")
    if not tokens:
        raise ModelLoadError(
            f"{file.path}: tokenizer.ggml.tokens is empty (0 tokens); a model needs a vocabulary"
        )
    return tokens


def load_gguf_tokenizer(file: GGUFFile) -> Tokenizer:
    """The runtime's Tokenizer (special tokens, chat template) for a GGUF file."""
    from runtime.models.tokenizer import Tokenizer  # lazy: the tokenizer module is the heavier one

    backend, config = gguf_tokenizer(file)
    tokenizer = Tokenizer(backend, config)
    tokenizer.check_chat_template(file.path)  # at load: not a 400 on every request
    return tokenizer


def tokenizer_config_json(config: dict[str, Any]) -> str:
    """tokenizer_config.json for a converted directory (what Tokenizer.from_dir reads back)."""
    return json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **config}, indent=2)
