"""bench.peer's pieces: the rope-layout permutation (checked against the math, not against
itself), the f32 GGUF export read back, the skip without llama.cpp, and (only where the optional
llama.cpp binding is installed: llama-cpp-python or llama_cpp_py_sync) greedy agreement and
the logits after the prompt against llama.cpp on a tiny llama."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench import peer
from bench.gguf_export import pair_rope_rows, write_gguf
from bench.peer_llama_cpp import pick_binding
from bench.peer_workers import (
    _kernels,
    _ours_spec,
    _prompt_logits,
    llama_cpp_runner,
    matching_side,
)
from runtime.models import ops
from tests.runtime.models.builders import build_llama


def _pair_rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """llama.cpp's rope (NORM type): dims (2i, 2i + 1) rotated by pos * theta^(-2i / D)."""
    d = x.shape[-1]
    angle = positions[:, None, None].double() * theta ** (-torch.arange(0, d, 2).double() / d)
    c, s = torch.cos(angle), torch.sin(angle)
    even, odd = x.double()[..., 0::2], x.double()[..., 1::2]
    return torch.stack((even * c - odd * s, odd * c + even * s), dim=-1).flatten(-2)


def test_permuted_rows_give_the_same_attention_scores() -> None:
    gen = torch.Generator().manual_seed(0)
    num_heads, num_kv, d, hidden, n = 4, 2, 16, 32, 7
    wq = torch.randn(num_heads * d, hidden, generator=gen, dtype=torch.float64)
    wk = torch.randn(num_kv * d, hidden, generator=gen, dtype=torch.float64)
    x = torch.randn(n, hidden, generator=gen, dtype=torch.float64)
    positions = torch.arange(3, 3 + n)
    # HF: half-split rotary on the checkpoint's rows
    q = (x @ wq.T).view(n, num_heads, d)
    k = (x @ wk.T).view(n, num_kv, d)
    hf_q, hf_k = ops.rotary_ref(q, k, positions, 10000.0, d)
    # llama.cpp: pair rotary on the permuted rows
    pq = _pair_rotary((x @ pair_rope_rows(wq, num_heads).T).view(n, num_heads, d), positions, 1e4)
    pk = _pair_rotary((x @ pair_rope_rows(wk, num_kv).T).view(n, num_kv, d), positions, 1e4)
    group = num_heads // num_kv
    hf_scores = torch.einsum("qhd,khd->hqk", hf_q, hf_k.repeat_interleave(group, 1))
    scores = torch.einsum("qhd,khd->hqk", pq, pk.repeat_interleave(group, 1))
    torch.testing.assert_close(scores, hf_scores)
    assert not torch.allclose(pq, hf_q)  # the layouts really differ


def test_gguf_export_reads_back(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf", reason="gguf is in the test extra")
    model_dir = build_llama(tmp_path / "llama", tokenizer=False)
    out = write_gguf(model_dir, tmp_path / "llama.gguf")
    reader = gguf.GGUFReader(str(out))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == "llama"
    assert fields["tokenizer.ggml.model"] == "no_vocab"
    assert fields["llama.attention.head_count_kv"] == 2
    tensors = {t.name: t for t in reader.tensors}
    assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    from safetensors.torch import load_file

    hf = load_file(model_dir / "model.safetensors")
    got_q = torch.from_numpy(tensors["blk.1.attn_q.weight"].data.copy())
    want_q = pair_rope_rows(hf["model.layers.1.self_attn.q_proj.weight"], 8)
    assert torch.equal(got_q.reshape(want_q.shape), want_q)
    got_up = torch.from_numpy(tensors["blk.0.ffn_up.weight"].data.copy())
    want_up = hf["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(got_up.reshape(want_up.shape), want_up)


def test_skips_with_the_reason_without_llama_cpp(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(peer, "llama_cpp_missing", lambda *_: "llama_cpp is not importable (test)")
    assert peer.main(["--quick"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out.strip().splitlines()[-1]) == {
        "skipped": "llama_cpp is not importable (test)"
    }
    assert "skipped: llama_cpp is not importable" in out.err


def test_first_greedy_tokens_agree_with_llama_cpp(tmp_path: Path) -> None:
    binding, missing = pick_binding()
    if binding is None:  # CI installs neither binding: llama.cpp is an optional extra
        pytest.skip(f"no llama.cpp binding (extra peer or peer-prebuilt): {missing}")
    from runtime.engine.offline import generate
    from runtime.engine.sampling import SamplingParams
    from runtime.models.loader import load_model

    model_dir = build_llama(tmp_path / "llama")
    prompt = [5, 17, 99, 3, 250, 11]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    loaded = load_model(model_dir, device="cpu")
    (ours,) = generate(loaded, [prompt], params)
    run = llama_cpp_runner(write_gguf(model_dir, tmp_path / "m.gguf"), binding, prompt)
    assert run(1, 8) == ours.token_ids
    theirs = torch.tensor(run(1, 0))
    torch.testing.assert_close(
        theirs, torch.tensor(_prompt_logits(loaded, prompt)), atol=1e-3, rtol=0
    )


@pytest.mark.parametrize(("qtype", "side"), [("Q8_0", "int8"), ("Q4_1", "int4"), ("F32", "int4")])
def test_the_compared_side_matches_the_files_format(tmp_path: Path, qtype: str, side: str) -> None:
    """Our int8 is compared with a Q8_0 file, our int4 with a 4-bit one (read from the tensors'
    types, not the file name)."""
    pytest.importorskip("gguf", reason="gguf is in the test extra")
    from tests.runtime.models.gguf_files import write_gguf as write_typed_gguf

    model_dir = build_llama(tmp_path / "llama", tokenizer=False)
    assert matching_side(write_typed_gguf(model_dir, tmp_path / "m.gguf", qtype=qtype)) == side


def test_requantize_needs_a_gguf_mode(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        peer.main(["--requantize", "Q8_0"])
    assert info.value.code == 2
    assert "--requantize goes with --real or --model-gguf" in capsys.readouterr().err


def test_compiled_needs_a_gguf_mode(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        peer.main(["--compiled"])
    assert info.value.code == 2
    assert "--compiled goes with --real or --model-gguf" in capsys.readouterr().err


def test_the_kernels_side_runs_every_quantized_gemm_once_a_token(tmp_path: Path) -> None:
    """The ceiling side times the compared format's weight GEMMs, the int8 LM head among them,
    each once per token, and nothing else of the model."""
    from torch.nn.modules.module import register_module_forward_hook

    from runtime.models.quant import Int4Linear, Int8Linear

    model_dir = build_llama(tmp_path / "llama", tokenizer=False)
    spec = _ours_spec(model_dir, "kernels", compared="int4")
    assert (spec["quantization"], spec["quantize_lm_head"]) == ("int4", True)
    run = _kernels(model_dir, spec["quantization"])
    calls: list[str] = []
    handle = register_module_forward_hook(lambda m, _i, _o: calls.append(type(m).__name__))
    try:
        assert run(1, 3) == []
    finally:
        handle.remove()
    per_token = len(calls) // 3
    assert len(calls) == 3 * per_token
    # every call is a quantized GEMM: 2 per layer for attention (qkv, o), 2 for the MLP, the head
    assert set(calls) == {Int4Linear.__name__, Int8Linear.__name__}
    assert calls[:per_token].count(Int8Linear.__name__) == 1  # the LM head
    assert per_token == 4 * 2 + 1  # TINY: 2 layers
