"""A tiny llama (with tokenizer) and PEFT adapters on it, shared by the LoRA tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.lora.adapters import make_adapter
from tests.runtime.models.builders import build_llama

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llama(tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def adapter_dirs(base_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Four adapters: different ranks, targets and rsLoRA; random A and B."""
    root = tmp_path_factory.mktemp("adapters")
    specs = {
        "a1": dict(rank=4, targets=ALL, seed=1),
        "a2": dict(rank=8, targets=("q_proj", "v_proj", "up_proj"), seed=2),
        "a3": dict(rank=16, targets=("o_proj", "down_proj", "gate_proj"), seed=3, use_rslora=True),
        "a4": dict(rank=2, targets=ALL, seed=4),
    }
    return {name: make_adapter(base_dir, root / name, **spec) for name, spec in specs.items()}
