"""Every way a checkpoint directory can be wrong gets a typed ModelLoadError that names the problem;
plus the formats that must load: sharded safetensors, metadata, legacy .bin under legacy_support."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.errors import ConfigError, ModelLoadError, UnsafeCheckpointError
from runtime.models import ARCHITECTURES, load_model
from tests.runtime.models.builders import build_llama, hf_model, to_legacy


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return build_llama(tmp_path / "llama", tokenizer=False)


def load(path: Path, **kwargs):
    return load_model(path, device="cpu", load_tokenizer=False, **kwargs)


def rewrite_weights(path: Path, edit) -> None:
    state = load_file(path / "model.safetensors")
    edit(state)
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})


def edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load(tmp_path / "nope")


def test_missing_config(ckpt: Path) -> None:
    (ckpt / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"config\.json not found"):
        load(ckpt)


def test_invalid_config_json(ckpt: Path) -> None:
    (ckpt / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], ')
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load(ckpt)


def test_config_missing_required_field(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["hidden_size"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="'hidden_size'"):
        load(ckpt)


def test_unsupported_architecture_is_named_with_supported_list(ckpt: Path) -> None:
    edit_config(ckpt, architectures=["MambaForCausalLM"])
    with pytest.raises(ModelLoadError) as err:
        load(ckpt)
    assert "'MambaForCausalLM'" in err.value.message
    assert all(name in err.value.message for name in ARCHITECTURES)


def test_missing_tensor_is_named(ckpt: Path) -> None:
    rewrite_weights(ckpt, lambda s: s.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(
        ModelLoadError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"
    ):
        load(ckpt)


def test_shape_mismatch_is_named(ckpt: Path) -> None:
    def shrink(state: dict[str, torch.Tensor]) -> None:
        state["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(8, 64)

    rewrite_weights(ckpt, shrink)
    with pytest.raises(ModelLoadError) as err:
        load(ckpt)
    assert "'model.layers.0.self_attn.k_proj.weight'" in err.value.message
    assert "[8, 64]" in err.value.message and "[16, 64]" in err.value.message


def test_unexpected_tensor_is_named(ckpt: Path) -> None:
    rewrite_weights(ckpt, lambda s: s.update({"model.layers.0.extra.weight": torch.zeros(2)}))
    with pytest.raises(
        ModelLoadError, match=r"unexpected tensor 'model\.layers\.0\.extra\.weight'"
    ):
        load(ckpt)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_safetensors(ckpt: Path, damage: str) -> None:
    file = ckpt / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(os.urandom(len(data)) if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="corrupt safetensors"):
        load(ckpt)


def test_no_weights_at_all(ckpt: Path) -> None:
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        load(ckpt)


def test_unknown_dtype(ckpt: Path) -> None:
    with pytest.raises(ConfigError, match="dtype"):
        load(ckpt, dtype="int8")


def test_sharded_checkpoint_loads_like_single_file(ckpt: Path, tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    hf_model(ckpt).save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    single, multi = load(ckpt).model.state_dict(), load(sharded).model.state_dict()
    assert single.keys() == multi.keys()
    assert all(torch.equal(single[k], multi[k]) for k in single)


def test_sharded_index_naming_a_missing_shard(ckpt: Path, tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    hf_model(ckpt).save_pretrained(sharded, max_shard_size="100KB")
    victim = sorted(sharded.glob("*.safetensors"))[0]
    victim.unlink()
    with pytest.raises(ModelLoadError, match=victim.name):
        load(sharded)


def test_safetensors_metadata_is_exposed(ckpt: Path) -> None:
    state = load_file(ckpt / "model.safetensors")
    save_file(state, ckpt / "model.safetensors", metadata={"format": "pt", "geglu_fix": "v1"})
    assert load(ckpt).metadata["geglu_fix"] == "v1"


def test_legacy_bin_refused_without_legacy_support(ckpt: Path) -> None:
    to_legacy(ckpt)
    with pytest.raises(ModelLoadError, match="fastllm convert"):
        load(ckpt)


def test_legacy_bin_loads_with_legacy_support(ckpt: Path, tmp_path: Path) -> None:
    reference = load(ckpt)
    assert not reference.is_legacy
    legacy = load(to_legacy(ckpt), legacy_support=True)
    assert legacy.is_legacy
    expected = reference.model.state_dict()
    assert all(torch.equal(t, expected[k]) for k, t in legacy.model.state_dict().items())


class _Payload:  # a pickle that would run code when loaded without weights_only
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_legacy_bin_with_code_is_refused(ckpt: Path) -> None:
    to_legacy(ckpt)
    torch.save({"model.embed_tokens.weight": _Payload()}, ckpt / "pytorch_model.bin")
    with pytest.raises(UnsafeCheckpointError):
        load(ckpt, legacy_support=True)
