"""Issue 29, item 4: `fastllm convert` (and every load) reads only files inside the checkpoint
directory: a `weight_map` entry that climbs out (`../other/model.safetensors`) or is absolute
(`/etc/passwd`) is refused before anything is opened, and so is a side file (tokenizer.json)
that is a symlink to a file elsewhere."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.errors import ModelLoadError
from runtime.models.checkpoint import open_checkpoint
from runtime.tools.convert import convert_checkpoint


@pytest.fixture
def layout(tmp_path: Path, demo_model_dir: Callable[[str], Path]) -> tuple[Path, Path]:
    """tmp/ckpt (config and tokenizer, weights only by index) and tmp/other (a whole model)."""
    demo = demo_model_dir("llama")
    other = shutil.copytree(demo, tmp_path / "other")
    ckpt = shutil.copytree(demo, tmp_path / "ckpt")
    (ckpt / "model.safetensors").unlink()
    return Path(ckpt), Path(other)


def _index(ckpt: Path, file: str) -> None:
    names = ["model.embed_tokens.weight"]  # a weight_map needs only its file names here
    body = {"metadata": {}, "weight_map": dict.fromkeys(names, file)}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(body))


@pytest.mark.parametrize("entry", ["../other/model.safetensors", "/etc/passwd", "a/../../x"])
def test_a_weight_map_pointing_outside_is_refused(
    layout: tuple[Path, Path], tmp_path: Path, entry: str
) -> None:
    ckpt, _ = layout
    _index(ckpt, entry)
    with pytest.raises(ModelLoadError, match="outside the checkpoint directory"):
        convert_checkpoint(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing converted, nothing written
    with pytest.raises(ModelLoadError, match="outside the checkpoint directory"):
        open_checkpoint(ckpt, legacy_support=True)


def test_a_side_file_symlinked_outside_is_refused(
    layout: tuple[Path, Path], tmp_path: Path
) -> None:
    ckpt, other = layout
    shutil.copy2(other / "model.safetensors", ckpt / "model.safetensors")
    secret = tmp_path / "secret.json"
    secret.write_text('{"not": "yours"}')
    (ckpt / "tokenizer_config.json").unlink()
    (ckpt / "tokenizer_config.json").symlink_to(secret)
    with pytest.raises(ModelLoadError, match="outside the checkpoint directory"):
        convert_checkpoint(ckpt, tmp_path / "out")
    assert not (tmp_path / "out" / "tokenizer_config.json").exists()


def test_shards_inside_the_directory_still_convert(
    layout: tuple[Path, Path], tmp_path: Path
) -> None:
    ckpt, other = layout
    (ckpt / "shards").mkdir()
    shutil.copy2(other / "model.safetensors", ckpt / "shards" / "part-1.safetensors")
    _index(ckpt, "shards/./part-1.safetensors")
    result = convert_checkpoint(ckpt, tmp_path / "out")
    assert result.num_tensors > 0
