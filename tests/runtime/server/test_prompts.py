"""runtime.server.prompts and the tokenizer bounds behind it (issue 39, item 2): a prompt known
to exceed the context is refused before it is encoded in full, and only where the bound holds."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from runtime.errors import InvalidRequestError
from runtime.models.tokenizer import Tokenizer
from runtime.server.prompts import check_prompt_chars, encode_bounded


@pytest.fixture
def tokenizer(demo_model_dir: Callable[[str], Path]) -> Tokenizer:
    return Tokenizer.from_dir(demo_model_dir("llama"))


def _words(num_chars: int) -> str:
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "kappa", "omega", "zeta", "theta"]
    text = ""
    while len(text) < num_chars:
        text += rng.choice(words) + " "
    return text[:num_chars]


def test_long_texts_encode_as_the_library_does(tokenizer: Tokenizer) -> None:
    reference = HFTokenizer.from_str(tokenizer.backend.to_str())
    for text in (_words(100), _words(50_000)):  # below and above the GIL-free length
        assert (
            tokenizer.encode(text, add_special_tokens=False)
            == reference.encode(text, add_special_tokens=False).ids
        )


def test_the_character_bound_holds_for_the_vocabulary(tokenizer: Tokenizer) -> None:
    longest = tokenizer.max_token_chars
    assert longest == max(len(t) for t in tokenizer.backend.get_vocab(True))
    for text in (_words(20_000), "x" * 20_000, " " * 20_000, "\u00e9\u4e2d" * 5_000):
        assert len(tokenizer.encode(text)) * longest >= len(text)


def test_no_character_bound_where_the_tokenizer_drops_characters() -> None:
    backend = HFTokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()  # a run of spaces is no token at all
    assert Tokenizer(backend).max_token_chars is None
    check_prompt_chars(Tokenizer(backend), 10**9, 10, "prompt")  # no refusal without a bound


def _spy(tokenizer: Tokenizer) -> list[int]:
    encoded: list[int] = []
    real = tokenizer.encode

    def encode(text: str, **kwargs: Any) -> list[int]:
        encoded.append(len(text))
        ids: list[int] = real(text, **kwargs)
        return ids

    tokenizer.encode = encode  # type: ignore[method-assign]
    return encoded


def test_the_character_bound_refuses_without_encoding(tokenizer: Tokenizer) -> None:
    encoded = _spy(tokenizer)
    room = 100
    assert tokenizer.max_token_chars is not None
    text = _words(2 * tokenizer.max_token_chars * room + 1)
    with pytest.raises(InvalidRequestError) as refused:
        encode_bounded(tokenizer, text, room=room, param="messages")
    assert refused.value.param == "messages" and encoded == []


def test_the_head_refuses_a_long_prompt_without_encoding_all_of_it(tokenizer: Tokenizer) -> None:
    tokenizer.__dict__["max_token_chars"] = 1000  # a vocabulary with a long entry: a weak bound
    encoded = _spy(tokenizer)
    room = 100
    text = _words(40 * (room + 64) * 8)
    with pytest.raises(InvalidRequestError, match="already"):
        encode_bounded(tokenizer, text, room=room)
    assert encoded and max(encoded) < len(text) // 10
    # the refusal is true: the whole text is far more tokens than the room
    assert len(HFTokenizer.from_str(tokenizer.backend.to_str()).encode(text).ids) > room


def test_a_prompt_that_fits_is_encoded_whole(tokenizer: Tokenizer) -> None:
    tokenizer.__dict__["max_token_chars"] = 1000
    text = _words(3000)
    room = len(tokenizer.encode(text))
    assert encode_bounded(tokenizer, text, room=room) == tokenizer.encode(text)
    assert encode_bounded(tokenizer, text, room=None) == tokenizer.encode(text)
