"""Tokenizer: a thin wrapper over `tokenizers.Tokenizer` (tokenizer.json) plus the bits of
tokenizer_config.json the runtime needs: bos/eos/pad tokens and the chat template.

Padding and truncation settings stored in tokenizer.json are switched off on load: some
checkpoints (sentence-transformers) ship `padding: Fixed 128`, which would silently change
what `encode` returns. The runtime pads and checks lengths itself.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tokenizers

from runtime.errors import ModelLoadError
from runtime.models.chat_template import (
    check_chat_template,
    render_chat_template,
    render_chat_template_async,
)
from runtime.models.long_text import ChunkPlan, chunk_plan, encode_chunked, encode_whole

__all__ = ["IncrementalDecoder", "Tokenizer"]

# `encode` of a text this long goes through runtime.models.long_text: encode_batch lets go of the
# GIL while the Rust side works (encode holds it: 1 MB held every other thread, the event loop's
# included, ~1 s), a chunk at a time where the ids cannot change (one 1 MB Encoding: +210 MB)
_GIL_FREE_CHARS = 4096
# texts whose tokens must not cover more characters each than the vocabulary's longest entry
_BOUND_PROBES = (" " * 256, "\n" * 256, "a" * 256, "0" * 256, "\u00e9" * 256, ". " * 128)


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json spells a special token as "<s>" or {"content": "<s>", ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data


class Tokenizer:
    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        config: dict[str, Any] | None = None,
        *,
        extra_eos_token_ids: Sequence[int] = (),
        chat_template: str | None = None,
    ) -> None:
        self.backend = backend
        backend.no_padding()
        backend.no_truncation()
        config = config or {}
        self.bos_token = _token_content(config.get("bos_token")) or _token_content(
            config.get("cls_token")
        )
        self.eos_token = _token_content(config.get("eos_token")) or _token_content(
            config.get("sep_token")
        )
        self.pad_token = _token_content(config.get("pad_token"))
        self.bos_token_id = self._id_of(self.bos_token)
        self.pad_token_id = self._id_of(self.pad_token)
        eos_ids = [self._id_of(self.eos_token), *extra_eos_token_ids]
        self.eos_token_ids: tuple[int, ...] = tuple(
            dict.fromkeys(i for i in eos_ids if i is not None)
        )
        template = chat_template or config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        self.chat_template: str | None = template if isinstance(template, str) else None

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelLoadError(f"{path}: no tokenizer.json")
        try:
            backend = tokenizers.Tokenizer.from_file(str(tok_file))
        except Exception as exc:  # the Rust side raises a bare Exception on bad files
            raise ModelLoadError(f"{tok_file}: cannot load tokenizer ({exc})") from exc
        config = _read_json(path / "tokenizer_config.json")
        # generation_config.json may list extra stop ids (e.g. Llama 3 <|eot_id|>)
        gen_eos = _read_json(path / "generation_config.json").get("eos_token_id")
        extra = (
            gen_eos if isinstance(gen_eos, list) else [gen_eos] if isinstance(gen_eos, int) else []
        )
        template_file = path / "chat_template.jinja"  # newer transformers save it beside the config
        template = template_file.read_text(encoding="utf-8") if template_file.is_file() else None
        tokenizer = cls(backend, config, extra_eos_token_ids=extra, chat_template=template)
        if tokenizer.vocab_size == 0:
            raise ModelLoadError(f"{tok_file}: the vocabulary has 0 tokens")
        tokenizer.check_chat_template(path)
        return tokenizer

    def check_chat_template(self, source: str | Path) -> None:
        """The template rendered once on a sample conversation (a one-line ModelLoadError naming
        `source` if it cannot render it: at load, not on every request)."""
        try:
            check_chat_template(
                self.chat_template, bos_token=self.bos_token or "", eos_token=self.eos_token or ""
            )
        except ModelLoadError as exc:
            raise ModelLoadError(f"{source}: {exc.message}") from exc

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    @functools.cached_property
    def max_token_chars(self) -> int | None:
        """An upper bound on the characters one token covers: the vocabulary's longest entry
        (byte-level entries spell each byte as one character, so this bounds multi-byte text
        too). A prompt of c characters is then at least c / this tokens, which refuses a huge
        prompt before tokenizing it. None where a probe shows the bound does not hold (a
        tokenizer that drops whitespace, or a normalizer that folds many characters into one)."""
        longest = max((len(token) for token in self.backend.get_vocab(True)), default=0)
        if longest < 1:
            return None
        for probe in _BOUND_PROBES:
            if len(self.backend.encode(probe, add_special_tokens=False).ids) * longest < len(probe):
                return None
        return longest

    @functools.cached_property
    def _chunk_plan(self) -> ChunkPlan | None:
        return chunk_plan(self.backend)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids: list[int]
        if len(text) < _GIL_FREE_CHARS:
            ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        elif self._chunk_plan is not None:
            plan = self._chunk_plan
            ids = encode_chunked(self.backend, plan, text, add_special_tokens=add_special_tokens)
        else:
            ids = encode_whole(self.backend, text, add_special_tokens=add_special_tokens)
        # a rendered chat template already starts with bos; the post-processor would add another
        bos = self.bos_token_id
        if add_special_tokens and bos is not None and ids[:2] == [bos, bos]:
            ids = ids[1:]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        text: str = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return text

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """Render messages with the tokenizer's own template, or the built-in one
        (see runtime.models.chat_template.DEFAULT_CHAT_TEMPLATE)."""
        return render_chat_template(
            self.chat_template,
            messages,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            add_generation_prompt=add_generation_prompt,
            tools=tools,
        )

    async def apply_chat_template_async(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """`apply_chat_template` off the event loop (for request handlers)."""
        return await render_chat_template_async(
            self.chat_template,
            messages,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            add_generation_prompt=add_generation_prompt,
            tools=tools,
        )


class IncrementalDecoder:
    """Turns a token stream into text deltas. A delta never ends in half a UTF-8 character:
    while the decoded tail is U+FFFD (an incomplete byte sequence) the text is held back.

    It decodes a short window `ids[prefix_offset:]` and emits what it adds beyond
    `ids[prefix_offset:read_offset]`, so tokenizers whose decoding depends on the previous
    token (SentencePiece leading spaces) stream the same text as a full decode.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        # a few prompt tokens of context; the decoded prompt itself is never emitted
        self.ids: list[int] = list(prompt_ids[-4:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        return self._delta(final=False)

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD)."""
        return self._delta(final=True)

    def _delta(self, *, final: bool) -> str:
        decode = self.tokenizer.decode
        prefix_text = decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = decode(self.ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not final):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return new_text[len(prefix_text) :]
