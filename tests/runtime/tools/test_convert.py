"""`fastllm convert`: the GeGLU fix against the formula (numpy, float64), provenance metadata,
loading and generating from the output (transformers as the reference), refusals."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from runtime.cli import main
from runtime.engine.offline import generate
from runtime.engine.sampling import SamplingParams
from runtime.errors import ConfigError, UnsafeCheckpointError
from runtime.models.loader import load_model
from runtime.tools.convert import (
    META_CONVERTED_FROM,
    META_GEGLU_FIX,
    META_SOURCE_SHA256,
    convert_checkpoint,
)
from tests.runtime.models.builders import to_legacy


@pytest.fixture
def gemma(demo_model_dir: Callable[[str], Path], tmp_path: Path) -> Path:
    """A private copy of the tiny gemma demo (tests turn it legacy or corrupt it)."""
    return Path(shutil.copytree(demo_model_dir("gemma"), tmp_path / "gemma"))


def _formula(w: np.ndarray) -> np.ndarray:
    w = w.astype(np.float64)
    return (w - w.mean(axis=1, keepdims=True)) / (w.std(axis=1, ddof=1, keepdims=True) + 1e-6)


def _metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
        return dict(handle.metadata() or {})


def test_geglu_fix_matches_the_formula_tensor_by_tensor(gemma: Path, tmp_path: Path) -> None:
    before = load_file(gemma / "model.safetensors")
    result = convert_checkpoint(gemma, tmp_path / "out", fix_geglu=True)
    after = load_file(tmp_path / "out" / "model.safetensors")
    assert after.keys() == before.keys()
    projections = {n for n in before if n.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight"))}
    assert set(result.fixed_tensors) == projections and len(projections) == 4  # 2 layers
    for name, tensor in after.items():
        assert tensor.dtype == before[name].dtype
        if name in projections:
            expected = _formula(before[name].numpy())
            np.testing.assert_allclose(tensor.numpy(), expected, rtol=1e-5, atol=1e-5)
            assert not torch.equal(tensor, before[name])
        else:
            assert torch.equal(tensor, before[name]), name


def test_metadata_records_fix_source_hash_and_origin(gemma: Path, tmp_path: Path) -> None:
    source_hash = hashlib.sha256((gemma / "model.safetensors").read_bytes()).hexdigest()
    convert_checkpoint(gemma, tmp_path / "out", fix_geglu=True)
    meta = _metadata(tmp_path / "out")
    assert meta[META_GEGLU_FIX] == "1"
    assert meta[META_SOURCE_SHA256] == source_hash
    assert meta[META_CONVERTED_FROM] == "safetensors"
    assert load_model(tmp_path / "out").metadata[META_GEGLU_FIX] == "1"


def test_legacy_input_is_converted_and_marked(gemma: Path, tmp_path: Path) -> None:
    reference = load_file(gemma / "model.safetensors")
    to_legacy(gemma)
    bin_hash = hashlib.sha256((gemma / "pytorch_model.bin").read_bytes()).hexdigest()
    convert_checkpoint(gemma, tmp_path / "out")
    out = tmp_path / "out"
    assert not (out / "pytorch_model.bin").exists()
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    converted = load_file(out / "model.safetensors")
    assert all(torch.equal(converted[k], v) for k, v in reference.items())
    meta = _metadata(out)
    assert meta[META_CONVERTED_FROM] == "legacy" and meta[META_GEGLU_FIX] == "0"
    assert meta[META_SOURCE_SHA256] == bin_hash
    # the legacy origin survives a second (safetensors -> safetensors) conversion
    convert_checkpoint(out, tmp_path / "again")
    assert _metadata(tmp_path / "again")[META_CONVERTED_FROM] == "legacy"


def test_converted_model_loads_and_generates_like_transformers(gemma: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    convert_checkpoint(gemma, out, fix_geglu=True)
    loaded = load_model(out)
    (ours,) = generate(
        loaded, ["The cache"], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    )
    assert ours.completion_tokens == 6
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    prompt = loaded.tokenizer.encode("The cache")
    with torch.no_grad():
        ids = torch.tensor([prompt])
        for _ in range(6):
            next_id = hf(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
    assert ours.token_ids == ids[0, len(prompt) :].tolist()


def test_double_fix_is_refused_unless_forced(gemma: Path, tmp_path: Path) -> None:
    once = tmp_path / "once"
    convert_checkpoint(gemma, once, fix_geglu=True)
    with pytest.raises(ConfigError, match="already has the GeGLU fix"):
        convert_checkpoint(once, tmp_path / "twice", fix_geglu=True)
    assert not (tmp_path / "twice" / "model.safetensors").exists()
    convert_checkpoint(once, tmp_path / "twice", fix_geglu=True, force=True)
    name = "model.layers.0.mlp.gate_proj.weight"
    first = load_file(once / "model.safetensors")[name]
    twice = load_file(tmp_path / "twice" / "model.safetensors")[name]
    np.testing.assert_allclose(twice.numpy(), _formula(first.numpy()), rtol=1e-5, atol=1e-5)
    # converting a fixed checkpoint without the flag keeps its record
    convert_checkpoint(once, tmp_path / "copy")
    assert _metadata(tmp_path / "copy")[META_GEGLU_FIX] == "1"


def test_fix_geglu_on_a_model_without_geglu_is_refused(
    demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="no GeGLU projection"):
        convert_checkpoint(demo_model_dir("llama"), tmp_path / "out", fix_geglu=True)


class _Payload:
    """Unpickling this runs a shell command that writes the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"echo pwned > {self.marker}",))


def test_malicious_pickle_is_refused_without_running_it(
    gemma: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "pwned"
    to_legacy(gemma)
    torch.save({"model.embed_tokens.weight": _Payload(marker)}, gemma / "pytorch_model.bin")
    with pytest.raises(UnsafeCheckpointError, match="not a plain tensor checkpoint"):
        convert_checkpoint(gemma, tmp_path / "out")
    with pytest.raises(SystemExit) as exc:
        main(["convert", "--input", str(gemma), "--output", str(tmp_path / "out"), "--quiet"])
    assert exc.value.code == 2
    assert "not a plain tensor checkpoint" in capsys.readouterr().err
    assert not marker.exists()
    assert not (tmp_path / "out" / "model.safetensors").exists()
    # the payload is live: an unsafe load would have written the marker
    torch.load(gemma / "pytorch_model.bin", weights_only=False)
    assert marker.exists()


def test_cli_converts_and_reports(
    gemma: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["convert", "--input", str(gemma), "--output", str(tmp_path / "o"), "--fix-geglu"])
        raise SystemExit(0)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "GeGLU fix on 4 tensors" in out
    assert _metadata(tmp_path / "o")[META_GEGLU_FIX] == "1"
