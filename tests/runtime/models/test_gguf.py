"""GGUF as a checkpoint source, on tiny random models written by llama.cpp's own writer
(gguf_files.py): our model from the .gguf against transformers loading the same file
(`gguf_file=`), for llama (q/k rope rows permuted in the file), qwen2 (biases, not permuted) and a
tied llama, in F32 and two block quantizations. The tiny F32 file also reproduces the original
safetensors checkpoint exactly, which transformers' agreement alone would not prove."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from runtime.errors import ModelLoadError
from runtime.models import CausalLM, load_model
from runtime.models.gguf_io import GGUFSource, check_gguf, model_args, open_gguf
from runtime.tools.convert_gguf import convert_gguf
from tests.runtime.models.builders import build_llama, build_qwen2
from tests.runtime.models.gguf_files import write_gguf
from tests.runtime.models.paged import Pages

TOL = 1e-5  # both sides dequantize with the gguf package; only summation order differs
IDS = [1, 5, 9, 22, 7, 100, 3, 250, 17]
BUILDERS: dict[str, Callable[[Path], Path]] = {
    "llama": lambda p: build_llama(p, tokenizer=False),
    "llama_tied": lambda p: build_llama(p, tie_word_embeddings=True, tokenizer=False),
    "qwen2": lambda p: build_qwen2(p, tokenizer=False),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf-src")
    return {name: build(root / name) for name, build in BUILDERS.items()}


def logits_of(model: object, ids: list[int]) -> torch.Tensor:
    assert isinstance(model, CausalLM)
    pages = Pages(model)
    (logits,) = pages.step([(pages.new(), ids)])
    return logits


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_1"])
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_logits_match_transformers_on_the_same_file(
    checkpoints: dict[str, Path], tmp_path: Path, name: str, qtype: str
) -> None:
    from transformers import AutoModelForCausalLM

    path = write_gguf(checkpoints[name], tmp_path / f"{name}.gguf", qtype=qtype)
    ours = load_model(path, device="cpu", load_tokenizer=False)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype="float32")
    with torch.no_grad():
        expected = hf.eval()(torch.tensor([IDS])).logits[0].float()
    torch.testing.assert_close(logits_of(ours.model, IDS), expected, atol=TOL, rtol=0)
    assert ours.metadata["fastllm.converted_from"] == "gguf"


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_f32_file_reproduces_the_original_checkpoint(
    checkpoints: dict[str, Path], tmp_path: Path, name: str
) -> None:
    path = write_gguf(checkpoints[name], tmp_path / f"{name}.gguf", qtype="F32")
    ours = load_model(path, device="cpu", load_tokenizer=False).model.state_dict()
    original = load_model(checkpoints[name], device="cpu", load_tokenizer=False)
    for key, tensor in original.model.state_dict().items():
        assert torch.equal(ours[key], tensor), key


def test_args_from_metadata(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    for name, src in checkpoints.items():
        expected = load_model(src, device="cpu", load_tokenizer=False).args
        got = model_args(open_gguf(write_gguf(src, tmp_path / f"{name}.gguf")))
        for field in (
            "arch", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
            "head_dim", "intermediate_size", "tie_word_embeddings", "qkv_bias", "o_bias",
            "architecture",
        ):  # fmt: skip
            assert getattr(got, field) == getattr(expected, field), (name, field)
        assert got.rope_theta == pytest.approx(expected.rope_theta)
        assert got.norm_eps == pytest.approx(expected.norm_eps)


def test_packed_tensors_stay_available_before_dequantizing(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """What a later quantized path intercepts: type, shape and raw bytes per HF name."""
    path = write_gguf(checkpoints["llama"], tmp_path / "q.gguf", qtype="Q8_0")
    file = open_gguf(path)
    source = GGUFSource(file, model_args(file))
    packed = source.gguf_tensor("model.layers.0.mlp.down_proj.weight")
    assert packed.ggml_type == "Q8_0"
    assert packed.shape == (64, 128)  # [out, in], torch order
    assert packed.data.nbytes == 64 * 128 // 32 * 34  # Q8_0: 32 values in 34 bytes
    norm = source.gguf_tensor("model.norm.weight")
    assert norm.ggml_type == "F32" and norm.shape == (64,)
    # 2 layers x 7 matrices + embedding + head; 2 layers x 2 norms + the final norm
    assert check_gguf(path).tensor_types == {"Q8_0": 16, "F32": 5}


def test_convert_writes_a_directory_that_loads_the_same(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    path = write_gguf(checkpoints["qwen2"], tmp_path / "m.gguf", qtype="Q4_1")
    result = convert_gguf(path, tmp_path / "out")
    # embedding, final norm, head + 2 layers x (7 matrices, 2 norms, 3 q/k/v biases)
    assert result.converted_from == "gguf" and result.num_tensors == 3 + 2 * 12
    converted = load_model(tmp_path / "out", device="cpu")
    direct = load_model(path, device="cpu")
    assert converted.args == direct.args
    types = dict(kv.split(":") for kv in converted.metadata["fastllm.gguf_types"].split(","))
    assert types == {"Q4_1": "16", "F32": "11"}
    assert converted.metadata["fastllm.gguf_file"] == "m.gguf"
    for key, tensor in direct.model.state_dict().items():
        assert torch.equal(converted.model.state_dict()[key], tensor), key
    assert converted.tokenizer is not None and direct.tokenizer is not None
    assert converted.tokenizer.vocab_size == direct.tokenizer.vocab_size == 320


def test_metadata_arrays_read_as_ggufs_own_reader_reads_them(tmp_path: Path) -> None:
    """open_gguf builds array fields without gguf's per-element slicing (reader._array_parts):
    every kind of array, non-ASCII strings and a big-endian file give gguf's own
    reader's fields (types, data indices, part bytes) and contents; a string array cut short
    is one line."""
    import gguf

    from runtime.models.gguf_io.reader import _checked_reader

    kinds = gguf.GGUFValueType
    arrays: dict[str, tuple[list[Any], Any]] = {
        "t.strings": (["a", "", "héllo wörld", "Ġthe", "<|im_end|>"], kinds.STRING),
        "t.i32": ([1, -2, 3, 2**31 - 1], kinds.INT32),
        "t.u8": ([0, 255, 7], kinds.UINT8),
        "t.f32": ([0.5, -1.25, 3e30], kinds.FLOAT32),
        "t.f64": ([0.1, 2.5], kinds.FLOAT64),
        "t.u64": ([2**63 + 5, 0], kinds.UINT64),
        "t.bools": ([True, False, True], kinds.BOOL),
    }
    for endianess in (gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG):
        path = tmp_path / f"{endianess.name}.gguf"
        writer = gguf.GGUFWriter(str(path), "llama", endianess=endianess)
        writer.add_string("t.scalar", "x")
        for key, (values, item) in arrays.items():
            writer.add_key_value(key, values, kinds.ARRAY, item)
        writer.add_tensor("w", np.zeros((2, 4), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        reference = gguf.GGUFReader(str(path))
        ours = _checked_reader(gguf, path, path.stat().st_size)
        assert list(ours.fields) == list(reference.fields)
        for name, want in reference.fields.items():
            got = ours.fields[name]
            assert (got.offset, got.types, got.data) == (want.offset, want.types, want.data), name
            assert [bytes(p) for p in got.parts] == [p.tobytes() for p in want.parts], name
            assert got.contents() == want.contents(), name
        metadata = open_gguf(path).metadata
        for key, (values, _) in arrays.items():
            assert metadata[key] == pytest.approx(values) if key.startswith("t.f") else values
    # the last string of t.strings cut to 2 of its 10 bytes: gguf's reader fails too
    data = (tmp_path / "LITTLE.gguf").read_bytes()
    cut = data.index(b"<|im_end|>") + 2
    (tmp_path / "short.gguf").write_bytes(data[:cut])
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        open_gguf(tmp_path / "short.gguf")
