"""Issue 25 item 6: every id of a random demo model decodes to text. `small` models declare 32,000
rows while the corpus trains ~1,200 BPE entries; `cover_vocab` fills the rest with word pieces
that BPE never produces, so encoding is unchanged and decoding covers the whole vocabulary."""

from __future__ import annotations

import pytest

from runtime.models.demo import demo_config
from runtime.models.demo_tokenizer import corpus_text, cover_vocab, train_demo_tokenizer
from tests.runtime.models.mixed_text import mixed_lines


@pytest.fixture(scope="module")
def trained_and_covered() -> tuple[object, object, int]:
    vocab_size = demo_config("llama", "small").vocab_size
    trained = train_demo_tokenizer("llama", vocab_size)
    return trained, cover_vocab(trained, vocab_size), vocab_size


def test_small_model_vocab_is_covered_by_its_tokenizer(trained_and_covered) -> None:
    trained, covered, vocab_size = trained_and_covered
    assert trained.get_vocab_size() < vocab_size  # what the issue found: 1,223 of 32,000
    assert covered.get_vocab_size() == vocab_size
    specials = 4  # <unk> <s> </s> <pad>: skipped when decoding
    empty = [i for i in range(vocab_size) if covered.decode([i]) == ""]
    assert empty == list(range(specials))


def test_encoding_is_unchanged(trained_and_covered) -> None:
    trained, covered, _ = trained_and_covered
    for line in corpus_text().splitlines() + mixed_lines(500, seed=3):
        assert covered.encode(line).ids == trained.encode(line).ids


def test_a_full_vocabulary_is_left_alone() -> None:
    tiny = train_demo_tokenizer("llama", 512)
    assert tiny.get_vocab_size() == 512
    assert cover_vocab(tiny, 512) is tiny
