"""Weight-only quantized linears (runtime.models.quant) against their dequantized fp32 reference,
the packed layouts, GGUF-style exact formats, bad metadata, and a quantized tiny model end to end.

Tolerances: the kernels run on bf16 activations, so a layer's output may differ from the fp32
product with the same dequantized weights by bf16 rounding of the input (8 mantissa bits):
|Δy| <= 1e-2 · max|y| for both formats (measured ~3e-3)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runtime.errors import ConfigError, ModelLoadError
from runtime.models.layers import Linear
from runtime.models.loader import load_model
from runtime.models.quant import Int4Linear, Int8Linear
from runtime.models.quantize import is_quantized, quantize_linear, weight_bytes_by_format
from runtime.verify.reference import reference_forward

KERNEL_REL_TOL = 1e-2


def _weights(out_f: int = 128, in_f: int = 96, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out_f, in_f, generator=g), torch.randn(out_f, generator=g)


@pytest.mark.parametrize("method, max_rel_rms", [("int8", 0.01), ("int4", 0.1)])
@pytest.mark.parametrize("shape", [(128, 96), (96, 64), (1536, 576)])
def test_quantized_linear_matches_its_dequantized_reference(
    method: str, max_rel_rms: float, shape: tuple[int, int]
) -> None:
    weight, bias = _weights(*shape)
    layer, report = quantize_linear("l", weight, bias, method, group_size=32)
    x = torch.randn(5, shape[1], generator=torch.Generator().manual_seed(1))
    expected = F.linear(x, layer.weight, bias)  # fp32 with the same dequantized weights
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert (got - expected).abs().max() <= KERNEL_REL_TOL * expected.abs().max()
    # what quantization itself cost is reported, and is what a 8/4-bit code can do
    assert 0 < report.rel_rms_error <= max_rel_rms
    assert report.max_abs_error == pytest.approx(float((weight - layer.weight).abs().max()))
    # int8: 1 byte a weight; int4: half a byte (a second copy of the codes where torch's packed
    # layout is not one we read back, or the AVX2 kernels' own copy: runtime.models.cpu_kernels),
    # plus the bf16 scales (and zeros)
    second = getattr(layer, "_own_codes", False) or bool(layer.gemv)
    ratio = 3 if method == "int8" or second else 6
    assert report.weight_bytes < report.float_bytes / ratio
    # a 3-d input (batch, seq, features) keeps its leading dims
    assert torch.equal(layer(x.view(1, 5, -1)).view(5, -1), got)


def test_int4_codes_survive_packing_in_both_layouts() -> None:
    """64-row blocks are read back from torch's packed layout where it is the one observed
    (AVX-512 builds); other shapes, and CPUs whose kernel packs otherwise (an AVX2-only host
    here on 5 December), keep own codes. Either way the codes survive."""
    for out_f in (128, 96):
        weight, _ = _weights(out_f, 64)
        layer = Int4Linear.quantize(weight, None, 32)
        # own codes, or the AVX2 kernels' copy read back (runtime.models.cpu_kernels)
        if out_f % 64:
            assert layer._own_codes is True or bool(layer.gemv)
        groups = weight.view(out_f, 2, 32)
        scale = layer.scales_zeros[..., 0].t()[..., None]
        zero = layer.scales_zeros[..., 1].t()[..., None]
        codes = torch.round((groups - (zero - 8 * scale)) / scale).clamp(0, 15).view(out_f, 64)
        assert torch.equal(layer.codes(), codes.to(torch.int32))


def test_gguf_q4_blocks_map_onto_the_int4_layer() -> None:
    """Q4_1: w = d·q + m → scale d, zero m + 8d; Q4_0: w = d·(q - 8) → zero 0. The CPU kernel
    keeps scale and zero in bf16, so Q4_0 with a bf16 d is exact, while Q4_1's zero m + 8d is
    rounded to bf16 (at most 2^-8 of |zero|): that rounding is the only error."""
    g = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 16, (64, 64), generator=g)
    d = (torch.rand(64, 2, generator=g) * 0.1 + 0.01).bfloat16().float()
    m = (-torch.rand(64, 2, generator=g)).bfloat16().float()
    expanded = codes.float().view(64, 2, 32)
    q4_1 = Int4Linear(codes, d, (m + 8 * d).bfloat16().float(), 32, None)
    want = (expanded * d[..., None] + m[..., None]).view(64, 64)
    zero = (m + 8 * d).abs().max()
    assert 0 < (q4_1.weight - want).abs().max() <= zero * 2**-8
    q4_0 = Int4Linear(codes, d, torch.zeros_like(d), 32, None)
    assert torch.equal(q4_0.weight, ((expanded - 8) * d[..., None]).view(64, 64))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Int4Linear(torch.zeros(64, 96), torch.ones(64, 2), torch.ones(64, 2), 48, None),
         "group size 48"),
        (lambda: Int4Linear(torch.zeros(64, 64), torch.ones(64, 3), torch.ones(64, 3), 32, None),
         "scales/zeros must be"),
        (lambda: Int4Linear(torch.full((64, 64), 16), torch.ones(64, 2), torch.ones(64, 2), 32,
                            None), "0..15"),
        (lambda: Int8Linear(torch.zeros(8, 4, dtype=torch.int8), torch.ones(7), None), "scales"),
        (lambda: Int8Linear(torch.zeros(8, 4), torch.ones(8), None), "int8 codes"),
    ],
)  # fmt: skip
def test_bad_quantization_metadata_is_one_line_model_load_error(
    build: Callable[[], object], message: str
) -> None:
    with pytest.raises(ModelLoadError, match=message) as info:
        build()
    assert "\n" not in str(info.value)


def test_unknown_method_and_fp8_off_cuda_are_config_errors() -> None:
    weight, _ = _weights()
    with pytest.raises(ConfigError, match="unknown quantization 'int3'"):
        quantize_linear("l", weight, None, "int3")
    with pytest.raises(ConfigError, match="compute capability"):
        quantize_linear("l", weight, None, "fp8")


@pytest.mark.parametrize(("method", "head"), [("int8", False), ("int4", True)])
def test_quantized_tiny_model_logits_follow_the_reference_with_the_same_weights(
    method: str, head: bool, demo_model_dir: Callable[[str], Path]
) -> None:
    """The reference path reads each quantized layer's dequantized weights (the int8 LM head's
    too, when asked for), so the production forward differs from it only by the kernels'
    activation rounding."""
    path = demo_model_dir("llama")
    loaded = load_model(path, device="cpu", quantization=method, quantize_lm_head=head)
    assert loaded.quantization is not None and is_quantized(loaded.model)
    num_layers = loaded.args.num_layers
    assert len(loaded.quantization.layers) == 4 * num_layers
    # the LM head: int8 per vocabulary row when asked, whatever the layers' method; the
    # embedding table stays in the serving dtype either way
    assert loaded.model.embed_tokens.weight.dtype == torch.float32
    if head:
        lm_head = loaded.model.lm_head
        assert isinstance(lm_head, Int8Linear) and lm_head.out_features == loaded.args.vocab_size
        assert loaded.quantization.head is not None and loaded.quantization.head.name == "lm_head"
        rows = torch.tensor([0, 7, loaded.args.vocab_size - 1])
        assert torch.equal(lm_head.weight_rows(rows), lm_head.weight[rows])
    else:
        assert not isinstance(loaded.model.lm_head, Int8Linear)
        assert loaded.quantization.head is None
    formats = weight_bytes_by_format(loaded.model)
    assert sum(formats.get(m, 0) for m in ("int8", "int4")) == loaded.quantization.weight_bytes
    if method == "int4":  # the tiny model's MLP width (176) is no multiple of 32: int8 there
        assert loaded.quantization.fallbacks == [
            f"layers.{i}.mlp.down_proj" for i in range(num_layers)
        ]
        assert formats["int4"] > 0
    assert formats["float32"] > 0  # embeddings and norms stay in the serving dtype
    float_model = load_model(path, device="cpu").model
    float_formats = weight_bytes_by_format(float_model)
    assert sum(formats.values()) < sum(float_formats.values())

    from runtime.engine.offline import generate
    from runtime.engine.sampling import SamplingParams

    prompts = [[5, 17, 42, 99], [7, 8, 9]]
    outs = generate(loaded, prompts, SamplingParams(max_tokens=4, temperature=0.0))
    assert all(len(o.token_ids) == 4 for o in outs)
    seqs = [(p + o.token_ids[:-1], o.token_ids[-1]) for p, o in zip(prompts, outs, strict=True)]
    ref = reference_forward(loaded.model, seqs, capture_layer=0)  # type: ignore[arg-type]
    # the dequantized fp32 model (a float model holding the same weights) agrees with it exactly
    _load_dequantized(float_model, loaded.model)
    ref_float = reference_forward(float_model, seqs, capture_layer=0)  # type: ignore[arg-type]
    assert ref_float.chosen_logits == pytest.approx(ref.chosen_logits, abs=1e-5)


def _load_dequantized(float_model: torch.nn.Module, quantized: torch.nn.Module) -> None:
    from runtime.models.quantize import PROJECTIONS

    for dst, src in zip(float_model.layers, quantized.layers, strict=True):  # type: ignore[arg-type]
        for path in PROJECTIONS:
            parent, attr = path.split(".")
            target = getattr(getattr(dst, parent), attr)
            target.weight_t.copy_(getattr(getattr(src, parent), attr).weight.t())
    # an int8 LM head: a float head holding its dequantized rows (the embedding table stays)
    head = quantized.lm_head
    if not isinstance(head, Int8Linear):
        return
    float_head = Linear(head.in_features, head.out_features, bias=False)
    float_head.weight_t.data = head.weight.t().contiguous()
    float_model.lm_head = float_head


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from runtime.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
        raise SystemExit(0)
    captured = capsys.readouterr()
    return int(exc.value.code or 0), captured.out + captured.err


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_convert_quantize_round_trips_through_the_loader(
    method: str,
    demo_model_dir: Callable[[str], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`fastllm convert --quantize` stores codes and scales; loading them gives the same layers
    (same dequantized weights, same outputs) as quantizing the float checkpoint at load."""
    from runtime.models.checkpoint import open_checkpoint

    out = tmp_path / "q"
    code, output = _cli(
        ["convert", "--input", str(demo_model_dir("llama")), "--output", str(out),
         "--quantize", method, "--quiet"], capsys,
    )  # fmt: skip
    assert code == 0, output
    assert f"projections {method}" in output and "relative RMS error" in output
    meta = open_checkpoint(out, legacy_support=False).metadata
    assert meta["fastllm.quantization"] == method and meta["fastllm.quant_group_size"] == "32"
    stored = load_model(out, device="cpu")
    at_load = load_model(demo_model_dir("llama"), device="cpu", quantization=method)
    assert stored.quantization is not None and stored.quantization.method == method
    x = torch.randn(3, stored.args.hidden_size, generator=torch.Generator().manual_seed(5))
    for a, b in zip(stored.model.layers, at_load.model.layers, strict=True):  # type: ignore[attr-defined]
        for m1, m2 in ((a.attn.qkv_proj, b.attn.qkv_proj), (a.attn.o_proj, b.attn.o_proj)):
            assert type(m1) is type(m2)
            assert torch.equal(m1.weight, m2.weight)
        assert torch.equal(a.attn.qkv_proj(x), b.attn.qkv_proj(x))
    # the LM head is stored in float; asked for, it is int8 both ways, quantized at load
    assert stored.quantization.head is None
    heads = [
        load_model(p, device="cpu", quantization=method, quantize_lm_head=True)
        for p in (out, demo_model_dir("llama"))
    ]
    for loaded in heads:
        assert isinstance(loaded.model.lm_head, Int8Linear) and loaded.quantization is not None
        assert loaded.quantization.head is not None and loaded.quantization.head.method == "int8"
    assert torch.equal(heads[0].model.lm_head.weight, heads[1].model.lm_head.weight)
    # a quantized checkpoint refuses another quantization, and cannot be quantized twice
    with pytest.raises(ConfigError, match="holds"):
        load_model(out, device="cpu", quantization="int8" if method == "int4" else "int4")
    code, output = _cli(
        ["convert", "--input", str(out), "--output", str(tmp_path / "qq"), "--quantize", "int8",
         "--quiet"], capsys,
    )  # fmt: skip
    assert code == 2 and "already quantized" in output and output.count("\n") == 1


def test_a_quantized_checkpoint_with_bad_metadata_is_one_line_error(
    demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    from runtime.models.checkpoint import open_checkpoint
    from runtime.tools.convert import convert_checkpoint

    out = tmp_path / "q"
    convert_checkpoint(demo_model_dir("llama"), out, quantize="int4")
    meta = open_checkpoint(out, legacy_support=False).metadata
    tensors = load_file(str(out / "model.safetensors"))
    cases = {
        "group size": ({**meta, "fastllm.quant_group_size": "48"}, tensors),
        "layout": ({**meta, "fastllm.quant_layout": "other"}, tensors),
        "missing tensor": (
            meta, {k: v for k, v in tensors.items() if k != "layers.0.attn.o_proj.zeros"}
        ),
        "scales/zeros must be": (
            meta, {**tensors, "layers.0.attn.o_proj.scales": torch.ones(3, 3)}
        ),
    }  # fmt: skip
    for message, (metadata, state) in cases.items():
        save_file(state, str(out / "model.safetensors"), metadata=metadata)
        with pytest.raises(ModelLoadError, match=message) as info:
            load_model(out, device="cpu")
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_add_to_accumulates_the_layer_output_in_place(method: str) -> None:
    weight, bias = _weights()
    layer, _ = quantize_linear("l", weight, bias, method)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(3))
    out = torch.ones(3, 128)
    same = layer.add_to_(out, x)  # type: ignore[operator]
    assert same is out and torch.equal(out, 1 + layer(x))


@pytest.mark.parametrize("out_f, in_f", [(1536, 576), (64, 40)])
def test_int8_codes_and_inputs_off_the_kernels_alignment_are_served_not_fatal(
    out_f: int, in_f: int
) -> None:
    """torch's CPU int8 kernel loads with aligned AVX-512 moves and killed the process (a general
    protection fault: two pytest workers in each full run, in the tensor-parallel tests) on codes
    1 byte off, on rows of 40 codes (a TP=2 shard of the demo llama) at 4 rows, and on an input
    16 bytes off. safetensors hands out mmap views at whatever offset the file gives, and a
    bf16 input can be a view. The layer keeps aligned, 16-wide codes and copies such an input;
    the product is the dequantized weight's. A regression kills the worker running this test:
    a failure either way."""
    weight, bias = _weights(out_f, in_f)
    aligned = Int8Linear.quantize(weight, bias)
    store = torch.empty(aligned.codes.numel() + 1, dtype=torch.int8)
    off_codes = store[1:].view_as(aligned.codes)
    off_codes.copy_(aligned.codes)
    assert off_codes.data_ptr() % 64 != 0
    layer = Int8Linear(off_codes, aligned.scales, bias)
    assert layer.codes.data_ptr() % 64 == 0 and layer.kernel_codes.shape[1] % 16 == 0
    x = torch.randn(4, in_f, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    buffer = torch.empty(x.numel() + 8, dtype=torch.bfloat16)
    off_x = buffer[8:].view_as(x)
    off_x.copy_(x)
    assert off_x.data_ptr() % 64 != 0
    out = layer(off_x)
    torch.testing.assert_close(out, aligned(x), rtol=0, atol=0)
    expected = F.linear(x.float(), layer.weight, bias)
    assert (out.float() - expected).abs().max() <= KERNEL_REL_TOL * expected.abs().max()
