"""A byte-level BPE tokenizer for the demo models, trained with `tokenizers` on corpus.txt
(prose about inference serving written for this project).

Special tokens follow each family's convention: llama <unk> <s> </s> <pad> (bos 1, eos 2),
gemma <pad> <eos> <bos> <unk> (pad 0, eos 1, bos 2), bert [PAD] [UNK] [CLS] [SEP] [MASK].
A post-processor adds bos (decoders) or [CLS] ... [SEP] (bert) when encoding with special tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

__all__ = ["SPECIAL_TOKENS", "TokenizerSpec", "cover_vocab", "train_demo_tokenizer"]


@dataclass(frozen=True)
class TokenizerSpec:
    specials: tuple[str, ...]  # id i = specials[i]
    config: dict[str, str]  # tokenizer_config.json role -> token


SPECIAL_TOKENS: dict[str, TokenizerSpec] = {
    "llama": TokenizerSpec(
        ("<unk>", "<s>", "</s>", "<pad>"),
        {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"},
    ),
    "gemma": TokenizerSpec(
        ("<pad>", "<eos>", "<bos>", "<unk>"),
        {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>"},
    ),
    "bert": TokenizerSpec(
        ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
        {
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "mask_token": "[MASK]",
        },
    ),
}


def corpus_text() -> str:
    return (Path(__file__).parent / "corpus.txt").read_text(encoding="utf-8")


def train_demo_tokenizer(arch: str, vocab_size: int) -> Tokenizer:
    """Train on corpus.txt up to `vocab_size` entries (fewer if the corpus runs out of merges).
    Deterministic: the trainer breaks ties by pair order, and the input never changes."""
    spec = SPECIAL_TOKENS[arch]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(spec.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_text().splitlines(keepends=True), trainer=trainer)
    ids = {t: i for i, t in enumerate(spec.specials)}
    if arch == "bert":
        cls, sep = "[CLS]", "[SEP]"
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}",
            pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, ids[cls]), (sep, ids[sep])],
        )
    else:
        bos = spec.config["bos_token"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B:1", special_tokens=[(bos, ids[bos])]
        )
    return tok


def cover_vocab(tok: Tokenizer, vocab_size: int) -> Tokenizer:
    """Extend a trained tokenizer's vocabulary to exactly `vocab_size` ids with word pieces from
    the corpus, so every id the model can emit decodes to text.

    The corpus yields far fewer BPE entries than the `small` models' 32,000 rows; without this,
    ids past the trained vocabulary decode to nothing and a random model streams empty text
    (benchmark clients then see late first tokens and "no content" responses). The new entries
    get no merges, so BPE never produces them: encoding is unchanged, only decoding covers more.
    """
    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    if len(vocab) >= vocab_size:
        return tok
    assert sorted(vocab.values()) == list(range(len(vocab)))  # ids stay contiguous
    for piece in _word_pieces(set(vocab)):
        vocab[piece] = len(vocab)
        if len(vocab) == vocab_size:
            break
    return Tokenizer.from_str(json.dumps(data))


def _word_pieces(taken: set[str]) -> Iterator[str]:
    """Byte-level spellings of corpus words, then their prefixes, then word pairs; new ones only,
    in a fixed order (same tokenizer on every build)."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    words = sorted({w.strip(".,;:()\"'") for w in corpus_text().split()} - {""})

    def spell(text: str) -> str:
        return "".join(piece for piece, _ in byte_level.pre_tokenize_str(text))

    def fresh(pieces: Iterator[str]) -> Iterator[str]:
        for piece in pieces:
            if piece not in taken:
                taken.add(piece)
                yield piece

    yield from fresh(spell(f" {w}") for w in words)
    yield from fresh(spell(w) for w in words)
    yield from fresh(spell(f" {w[:n]}") for w in words for n in range(2, len(w)))
    yield from fresh(spell(f" {a} {b}") for a in words for b in words)


def save_demo_tokenizer(tok: Tokenizer, arch: str, path: Path, *, max_length: int) -> None:
    tok.save(str(path / "tokenizer.json"))
    config = {
        **SPECIAL_TOKENS[arch].config,
        "model_max_length": max_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
