"""Where the compiled CPU step's caches and saved graphs live (runtime.models.fast.compile_cache):
a directory per model, weight format and dtype, a new one when the checkpoint's files change;
the inductor cache variable set only for the duration. (No compiling here: seconds.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from runtime.models.fast.compile_cache import inductor_cache_dir, model_cache_dir


def checkpoint(tmp_path: Path) -> Path:
    model = tmp_path / "llama-tiny"
    model.mkdir()
    (model / "config.json").write_text('{"rms_norm_eps": 1e-6}')
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    return model


def test_a_directory_per_model_format_and_dtype(tmp_path: Path) -> None:
    model = checkpoint(tmp_path)
    root = tmp_path / "cache"
    base = model_cache_dir(root, model, torch.float32, "float")
    assert base.parent == root and base.name.startswith("llama-tiny-")
    assert model_cache_dir(root, model, torch.float32, "float") == base  # stable
    others = {
        model_cache_dir(root, model, torch.bfloat16, "float"),
        model_cache_dir(root, model, torch.float32, "int4/g32"),
        model_cache_dir(root, model, torch.float32, "int4/g32+int8-head"),
    }
    assert base not in others and len(others) == 3


def test_a_rewritten_checkpoint_gets_a_new_directory(tmp_path: Path) -> None:
    """The saved graphs bake in the config's constants: an edited config.json (same path)
    must not reuse them."""
    model = checkpoint(tmp_path)
    before = model_cache_dir(None, model, torch.float32, "float")
    config = model / "config.json"
    config.write_text('{"rms_norm_eps": 1e-5}')
    later = time.time_ns() + 10**9  # a different mtime even on a coarse-grained filesystem
    os.utime(config, ns=(later, later))
    assert model_cache_dir(None, model, torch.float32, "float") != before


def test_the_inductor_variable_is_set_only_inside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    target = tmp_path / "a" / "b"
    with inductor_cache_dir(target) as directory:
        assert directory.is_dir() and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(target)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/elsewhere"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    with inductor_cache_dir(target):
        pass
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
