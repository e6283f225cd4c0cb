"""Issue 39, findings 6, 9, 10 and the minor GGUF ones: metadata that lies about sizes is refused
before anything is sized from it, with one line naming the key, from the loader, `fastllm
convert` and `fastllm serve` (exit 2, before the server starts) alike. The hostile files are
good tiny files rewritten by llama.cpp's own writer (gguf_hostile.py). Before the fix,
`llama.block_count = 2**31` built a weight table of ~20 GB (pytest-timeout would stop this test);
`context_length = 2**32 - 1`, a 0-token list and `bos_token_id = 10**9` were accepted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import runtime.server
from runtime.cli import main
from runtime.errors import ModelLoadError
from runtime.models import load_model
from runtime.tools.convert import convert_checkpoint
from tests.runtime.models.builders import build_llama
from tests.runtime.models.gguf_files import write_gguf
from tests.runtime.models.gguf_hostile import empty_token_list, rewrite


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gguf-bounds")
    return write_gguf(build_llama(root / "m", tokenizer=False), root / "good.gguf")


def _meta(overrides: dict[str, Any]) -> Callable[[Path, Path], Path]:
    return lambda good, out: rewrite(good, out, overrides)


HOSTILE: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "block_count_2_31": (
        _meta({"llama.block_count": 2**31}),
        "'llama.block_count' is 2147483648, beyond the 1024",
    ),
    "block_count_beyond_tensors": (
        _meta({"llama.block_count": 1000}),
        "'llama.block_count' is 1000, the checkpoint holds tensors for 2 layers",
    ),
    "context_length_2_32": (
        _meta({"llama.context_length": 2**32 - 1}),
        "'llama.context_length' is 4294967295, beyond the 16777216",
    ),
    "vocab_2_40": (_meta({"llama.vocab_size": 2**40}), "'llama.vocab_size' is 1099511627776"),
    "hidden_2_31": (_meta({"llama.embedding_length": 2**31}), "'llama.embedding_length' is"),
    "heads_2_31": (_meta({"llama.attention.head_count": 2**31}), "'llama.attention.head_count'"),
    "ff_2_31": (_meta({"llama.feed_forward_length": 2**31}), "'llama.feed_forward_length'"),
    "freq_base_inf": (
        _meta({"llama.rope.freq_base": float("inf")}),
        "invalid llama.rope.freq_base inf",
    ),
    "zero_tokens": (empty_token_list, "tokenizer.ggml.tokens has 0 tokens"),
    "no_token_list": (
        _meta({"tokenizer.ggml.tokens": None}),
        "GGUF tokenizer has no tokenizer.ggml.tokens list",
    ),
    "more_tokens_than_rows": (
        _meta({"tokenizer.ggml.tokens": [f"<t{i}>" for i in range(400)]}),
        "has 400 tokens, more than the 320 rows of the embedding",
    ),
    "far_fewer_tokens_than_rows": (
        _meta({"tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.token_type": [1, 1]}),
        "has 2 tokens for 320 embedding rows",
    ),
    "bos_10_9": (
        _meta({"tokenizer.ggml.bos_token_id": 10**9}),
        "tokenizer.ggml.bos_token_id 1000000000 is not a token id",
    ),
    "eos_past_vocab": (
        _meta({"tokenizer.ggml.eos_token_id": 320}),
        "tokenizer.ggml.eos_token_id 320 is not a token id",
    ),
    "sentencepiece": (
        _meta({"tokenizer.ggml.model": "llama"}),
        "GGUF tokenizer model 'llama'; supported: 'gpt2'",
    ),
}


@pytest.fixture(params=sorted(HOSTILE))
def hostile(request: pytest.FixtureRequest, good_gguf: Path, tmp_path: Path) -> tuple[Path, str]:
    make, reason = HOSTILE[request.param]
    return make(good_gguf, tmp_path / "model.gguf"), reason


def test_loader_refuses_in_one_line(hostile: tuple[Path, str]) -> None:
    path, reason = hostile
    with pytest.raises(ModelLoadError) as exc:
        load_model(path, device="cpu")
    message = str(exc.value)
    assert "\n" not in message and str(path) in message and reason in message


def test_convert_refuses_what_serve_refuses(
    hostile: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, reason = hostile
    with pytest.raises(SystemExit) as exc:
        main(["convert", "--input", str(path), "--output", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and reason in err
    assert not (tmp_path / "out").exists()


def test_serve_refuses_before_starting(
    hostile: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the hostile file passed the startup checks: the server would start")

    monkeypatch.setattr(runtime.server, "create_app", never)
    monkeypatch.setattr(runtime.server, "run_server", never)
    path, reason = hostile
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--model", str(path), "--port", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and reason in err


def test_no_message_contradicts_itself(good_gguf: Path, tmp_path: Path) -> None:
    """'gpt2' with a missing token list used to read "'gpt2' is not supported (only 'gpt2')"."""
    path = rewrite(good_gguf, tmp_path / "m.gguf", {"tokenizer.ggml.tokens": None})
    with pytest.raises(ModelLoadError) as exc:
        load_model(path, device="cpu")
    assert "not supported" not in str(exc.value)


def test_the_good_file_still_loads(good_gguf: Path) -> None:
    loaded = load_model(good_gguf, device="cpu")
    assert loaded.args.num_layers == 2 and loaded.tokenizer is not None


# the same bounds on a safetensors directory's config.json
CONFIG_LIES: dict[str, tuple[dict[str, Any], str]] = {
    "layers_2_31": ({"num_hidden_layers": 2**31}, "'num_hidden_layers' is 2147483648, beyond"),
    "layers_beyond_tensors": (
        {"num_hidden_layers": 1000},
        "'num_hidden_layers' is 1000, the checkpoint holds tensors for 2 layers",
    ),
    "context_2_32": (
        {"max_position_embeddings": 2**32 - 1},
        "'max_position_embeddings' is 4294967295",
    ),
    "bos_10_9": ({"bos_token_id": 10**9}, "bos_token_id 1000000000 is not a token id"),
    "eos_list_past_vocab": ({"eos_token_id": [2, 320]}, "eos_token_id 320 is not a token id"),
}


@pytest.fixture(params=sorted(CONFIG_LIES))
def lying_dir(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    changes, reason = CONFIG_LIES[request.param]
    path = build_llama(tmp_path / "llama", tokenizer=False)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **changes}))
    return path, reason


def test_config_json_lies_refused_by_loader_and_convert(
    lying_dir: tuple[Path, str], tmp_path: Path
) -> None:
    path, reason = lying_dir
    with pytest.raises(ModelLoadError) as exc:
        load_model(path, device="cpu", load_tokenizer=False)
    assert reason in str(exc.value)
    with pytest.raises(ModelLoadError) as exc:
        convert_checkpoint(path, tmp_path / "out")
    assert reason in str(exc.value)
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_model_dir_with_an_empty_vocabulary_refused(
    demo_model_dir: Callable[[str], Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A tokenizer.json with 0 tokens: refused by the loader, `convert` and `serve` (it used to
    serve, answering every chat with a 400)."""
    import shutil

    import tokenizers

    path = tmp_path / "llama"
    shutil.copytree(demo_model_dir("llama"), path)
    tokenizers.Tokenizer(tokenizers.models.BPE({}, [])).save(str(path / "tokenizer.json"))
    with pytest.raises(ModelLoadError, match="the vocabulary has 0 tokens"):
        load_model(path, device="cpu")
    with pytest.raises(ModelLoadError, match="the vocabulary has 0 tokens"):
        convert_checkpoint(path, tmp_path / "out")

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the empty vocabulary passed the startup checks")

    monkeypatch.setattr(runtime.server, "create_app", never)
    monkeypatch.setattr(runtime.server, "run_server", never)
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--model", str(path), "--port", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "0 tokens" in err


def test_block_count_2_31_allocates_nothing_of_its_size(good_gguf: Path, tmp_path: Path) -> None:
    """The weight table of 2**31 layers was ~20 GB of Python objects before any check."""
    import tracemalloc

    path = rewrite(good_gguf, tmp_path / "m.gguf", {"llama.block_count": 2**31})
    tracemalloc.start()
    try:
        with pytest.raises(ModelLoadError):
            load_model(path, device="cpu")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20
