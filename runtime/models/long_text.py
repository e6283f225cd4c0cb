"""Long texts encoded a chunk at a time, ids only (issue 39, item 2).

`tokenizers` encodes a whole 1 MB text into one Encoding: its pre-tokenizer keeps a string and a
per-byte alignment table for every word, and the result holds a token string, offsets and masks
per token. For the demo llama's 540,000 tokens that is +210 MB for one call (0.8 s), and six
concurrent /tokenize calls took the server from ~1.2 GB to ~2 GB. Encoded in ~16K-character
chunks, each chunk's Encoding is freed before the next, and `encode_batch_fast` (no offsets,
tokenizers >= 0.21) lets go of the GIL for all of it: +4 MB, 0.24 s, the same ids.

The same ids only where a cut cannot change them, which `chunk_plan` decides from the tokenizer's
own description: a cut falls just before a U+0020 space whose previous character is not
whitespace, which every pre-tokenizer accepted here already splits at (GPT-2's byte-level regex
ends the match holding a non-space character there and starts the next at the space; the
whitespace and BERT splitters split on the space itself), so BPE or WordPiece never merges across
it; normalizers are accepted only where they map characters one by one (a space composes with
nothing). Anything else (SentencePiece's prepended "▁", a regex `Split` of unknown shape, an added
token that swallows whitespace to its right or holds a space) is encoded whole, still GIL-free.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import tokenizers

CHUNK_CHARS = 16384  # ~4 MB of transient Rust state a chunk for the demo llama; 1 C call each

_CHAR_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "BertNormalizer"}
_SPLITTERS = {"Whitespace", "WhitespaceSplit", "BertPreTokenizer"}
_POST_PROCESSORS = {"TemplateProcessing", "BertProcessing", "RobertaProcessing", "ByteLevel"}


@dataclass(frozen=True)
class ChunkPlan:
    """The special ids the post-processor puts around a text's own ids."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]


def _members(node: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """A component and, for a `Sequence`, its members (nested sequences flattened)."""
    if node is None:
        return []
    if node.get("type") == "Sequence":
        return [m for sub in node.get(key, []) for m in _members(sub, key)]
    return [node]


def _pre_tokenizer_splits(node: dict[str, Any] | None) -> bool:
    """True when the pre-tokenizer splits before every space that follows a non-space (the
    members other than the splitter only re-split within what it produced)."""
    members = _members(node, "pretokenizers")
    splits = False
    for m in members:
        kind = m.get("type")
        if kind == "ByteLevel":
            if m.get("add_prefix_space"):  # each chunk would get its own leading space
                return False
            splits = splits or bool(m.get("use_regex", True))
        elif kind in _SPLITTERS:
            splits = True
        elif kind not in {"Punctuation", "Digits"}:  # finer splitters only add cuts
            return False
    return splits


def _special_ids(backend: tokenizers.Tokenizer) -> ChunkPlan | None:
    """What add_special_tokens adds, read off a one-word probe; None if it is not a prefix and
    a suffix around the text's ids."""
    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    for k in range(len(full) - len(plain) + 1):
        if full[k : k + len(plain)] == plain:
            return ChunkPlan(tuple(full[:k]), tuple(full[k + len(plain) :]))
    return None


def chunk_plan(backend: tokenizers.Tokenizer) -> ChunkPlan | None:
    """How `backend` may encode a long text in chunks with the same ids; None: it may not.
    Reads the whole description (the vocabulary too): once per tokenizer, not per call."""
    spec = json.loads(backend.to_str())
    normalizers = _members(spec.get("normalizer"), "normalizers")
    if any(m.get("type") not in _CHAR_NORMALIZERS for m in normalizers):
        return None
    if not _pre_tokenizer_splits(spec.get("pre_tokenizer")):
        return None
    for added in spec.get("added_tokens", []):
        if added.get("rstrip") or any(c.isspace() for c in added.get("content", " ")):
            return None
    processors = _members(spec.get("post_processor"), "processors")
    if any(m.get("type") not in _POST_PROCESSORS for m in processors):
        return None
    return _special_ids(backend)


def cuts(text: str, size: int = CHUNK_CHARS) -> Iterator[tuple[int, int]]:
    """(start, end) of chunks of about `size` characters, each cut just before a space that
    follows a non-space; a text without such a place is one chunk."""
    start, n = 0, len(text)
    while start < n:
        end = text.find(" ", start + size)
        while end > 0 and text[end - 1].isspace():
            end = text.find(" ", end + 1)
        end = n if end < 0 else end
        yield start, end
        start = end


def encode_chunked(
    backend: tokenizers.Tokenizer, plan: ChunkPlan, text: str, *, add_special_tokens: bool
) -> list[int]:
    """`backend.encode(text, add_special_tokens).ids`, a chunk at a time (see the module doc)."""
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    # a list, not an array: each chunk's ids arrive as a list of ints already, and a list
    # extends by pointer (an array would convert every id twice, ~20 ms of GIL for 1 MB)
    ids = list(plan.prefix if add_special_tokens else ())
    for start, end in cuts(text):
        ids += encode([text[start:end]], add_special_tokens=False)[0].ids
    if add_special_tokens:
        ids += plan.suffix
    return ids


def encode_whole(
    backend: tokenizers.Tokenizer, text: str, *, add_special_tokens: bool
) -> list[int]:
    """One Encoding for the whole text, without offsets where the library can, GIL-free."""
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    ids: list[int] = encode([text], add_special_tokens=add_special_tokens)[0].ids
    return ids
