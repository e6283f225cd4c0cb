"""Bad adapters are one-line typed errors (LoraAdapterError, a 400), before anything is
resident: missing files, a pickle, a rank above the bound, wrong shapes, unsupported options,
a path outside `lora_dir`; and `fastllm serve --lora` with one of them exits 2 in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.cli import main
from runtime.models.loader import read_args
from runtime.models.lora import LoraAdapterError, read_adapter
from runtime.models.lora.peft import resolve_adapter_path
from tests.runtime.lora.adapters import bad_adapters

EXPECTED_CODES = {
    "missing_weights": "lora_missing_file",
    "missing_config": "lora_missing_file",
    "pickle": "lora_unsafe_file",
    "rank_above_bound": "lora_rank_too_large",
    "wrong_shape": "lora_shape_mismatch",
    "dora": "lora_unsupported",
    "not_json": "lora_bad_config",
    "nowhere": "lora_not_found",
}


@pytest.fixture(scope="module")
def bad(adapter_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    return bad_adapters(adapter_dirs["a1"], tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize("kind", sorted(EXPECTED_CODES))
def test_bad_adapter_is_one_typed_line(bad, base_dir: Path, kind: str) -> None:
    with pytest.raises(LoraAdapterError) as exc:
        read_adapter(bad[kind], read_args(base_dir), max_rank=16)
    assert exc.value.code == EXPECTED_CODES[kind]
    assert exc.value.http_status == 400 and "\n" not in exc.value.message


def test_pickle_is_never_opened(bad, base_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("torch.load called on an adapter")

    monkeypatch.setattr(torch, "load", refuse)
    with pytest.raises(LoraAdapterError):
        read_adapter(bad["pickle"], read_args(base_dir), max_rank=16)


def test_path_outside_lora_dir(adapter_dirs: dict[str, Path], tmp_path: Path) -> None:
    root = adapter_dirs["a1"].parent
    assert resolve_adapter_path("a1", root) == adapter_dirs["a1"].resolve()
    for outside in ("../elsewhere", str(tmp_path), "a1/../../x"):
        with pytest.raises(LoraAdapterError) as exc:
            resolve_adapter_path(outside, root)
        assert exc.value.code == "lora_path_outside"
    (root / "link").symlink_to(tmp_path)  # a symlink out of the directory is outside too
    with pytest.raises(LoraAdapterError):
        resolve_adapter_path("link", root)


@pytest.mark.parametrize(
    "kind", ["pickle", "wrong_shape", "rank_above_bound", "missing_weights", "nowhere"]
)
def test_serve_with_a_bad_lora_exits_2(
    bad, base_dir: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--model", str(base_dir), "--lora", f"bad={bad[kind]}", "--port", "0"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exc.value.code == 2
    assert len(lines) == 1 and "--lora bad" in lines[0]


def test_serve_with_a_lora_outside_lora_dir_exits_2(
    adapter_dirs: dict[str, Path],
    base_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("FASTLLM_LORA_DIR", str(adapter_dirs["a1"].parent))
    argv = ["serve", "--model", str(base_dir), "--lora", "out=../elsewhere", "--port", "0"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exc.value.code == 2
    assert len(lines) == 1 and "--lora out" in lines[0] and "outside" in lines[0]
