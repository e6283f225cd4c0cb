"""Dense bf16 copies of quantized layers for calls of many rows (runtime.models.dense_batch): which
kernel a call runs, what the copy computes, the modes, and an engine serving with them.

The copy is the layer's dequantized weight rounded to bf16, so from `dense_min_rows` rows on a
call equals `F.linear` of the bf16 input with it exactly, and stays within bf16 rounding of
the fp32 product with the dequantized weight (|Δy| <= 1e-2 · max|y|, as the kernels' own
tolerance in test_quant.py)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runtime.errors import ConfigError
from runtime.models import dense_batch
from runtime.models.dense_batch import attach_dense_copies
from runtime.models.loader import load_model
from runtime.models.quant import Int4Linear, Int8Linear, QuantizedLinear
from runtime.models.quantize import DENSE_KEY, weight_bytes_by_format

REL_TOL = 1e-2


def _layer(method: str, out_f: int = 128, in_f: int = 96) -> QuantizedLinear:
    g = torch.Generator().manual_seed(3)
    weight, bias = torch.randn(out_f, in_f, generator=g), torch.randn(out_f, generator=g)
    if method == "int8":
        return Int8Linear.quantize(weight, bias)
    return Int4Linear.quantize(weight, bias, group_size=32)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_a_call_of_many_rows_runs_the_copy_and_fewer_the_kernel(method: str) -> None:
    layer = _layer(method)
    g = torch.Generator().manual_seed(4)
    few, many = torch.randn(3, 96, generator=g), torch.randn(4, 96, generator=g)
    kernel_few, kernel_many = layer(few), layer(many)
    dense = layer.weight.to(torch.bfloat16)
    layer.attach_dense(dense, 4)
    assert layer.dense is dense and layer.dense_min_rows == 4
    # below the bound: the quantized kernel, bit for bit as before
    assert torch.equal(layer(few), kernel_few)
    # from the bound on: the bf16 GEMM with the copy, then the bias in the serving dtype
    got = layer(many)
    assert not torch.equal(got, kernel_many)  # a different kernel ran
    assert torch.equal(got, F.linear(many.to(torch.bfloat16), dense).float() + layer.bias)
    expected = F.linear(many, layer.weight, layer.bias)  # fp32 with the dequantized weight
    assert (got - expected).abs().max() <= REL_TOL * expected.abs().max()
    # a 3-d input counts its rows across the leading dims: 1 x 4 rows runs the copy too
    assert torch.equal(layer(many.view(1, 4, -1)).view(4, -1), got)


def test_a_copy_of_the_wrong_shape_or_no_bound_is_refused() -> None:
    layer = _layer("int8")
    with pytest.raises(ValueError, match="dense copy"):
        layer.attach_dense(torch.zeros(96, 128, dtype=torch.bfloat16), 4)
    with pytest.raises(ValueError, match="dense copy"):
        layer.attach_dense(layer.weight.to(torch.bfloat16), 0)


def _quantized(demo_model_dir: Callable[[str], Path]) -> torch.nn.Module:
    path = demo_model_dir("llama")
    return load_model(path, device="cpu", quantization="int4", quantize_lm_head=True).model


def _layers(model: torch.nn.Module) -> list[QuantizedLinear]:
    return [m for m in model.modules() if isinstance(m, Int8Linear | Int4Linear)]


def test_modes_and_the_byte_bound(demo_model_dir: Callable[[str], Path]) -> None:
    model = _quantized(demo_model_dir)
    layers = _layers(model)
    dtype = dense_batch.dense_dtype()  # bf16 where the CPU has it natively, else fp32
    copies = sum(m.in_features * m.out_features * dtype.itemsize for m in layers)
    off = attach_dense_copies(model, "off", max_bytes=1 << 40)
    assert off.num_layers == 0 and off.reason == "off"
    small = attach_dense_copies(model, "auto", max_bytes=copies - 1)
    assert small.num_layers == 0 and "exceed dense_batch_max_bytes" in small.reason
    assert all(m.dense is None for m in layers)
    assert DENSE_KEY not in weight_bytes_by_format(model)
    compiled = attach_dense_copies(model, "on", max_bytes=0, min_rows=6, compiled=True)
    assert compiled.num_layers == 0 and "compile=on" in compiled.reason
    parallel = attach_dense_copies(model, "on", max_bytes=0, min_rows=6, tensor_parallel=True)
    assert parallel.num_layers == 0 and parallel.reason == "tensor parallel"
    # `on` ignores the bound; a given row bound is used as is (nothing measured)
    on = attach_dense_copies(model, "on", max_bytes=0, min_rows=6)
    assert (on.num_layers, on.bytes, on.min_rows) == (len(layers), copies, 6)
    assert all(m.dense is not None and m.dense_min_rows == 6 for m in layers)
    assert all(m.dense is not None and m.dense.dtype == dtype for m in layers)
    assert weight_bytes_by_format(model)[DENSE_KEY] == copies
    # a second engine on the same weights keeps the copies it finds
    again = attach_dense_copies(model, "auto", max_bytes=1 << 40, min_rows=9)
    assert (again.num_layers, again.min_rows) == (len(layers), 6)
    # and one whose settings rule them out drops them: `off` means the kernels for every call
    dropped = attach_dense_copies(model, "off", max_bytes=1 << 40)
    assert dropped.num_layers == 0 and all(m.dense is None for m in layers)
    assert DENSE_KEY not in weight_bytes_by_format(model)
    with pytest.raises(ValueError, match="dense_batch_weights"):
        attach_dense_copies(model, "always", max_bytes=0)


@pytest.mark.parametrize(
    ("bf16", "amx", "expected"),
    [(True, False, torch.bfloat16), (False, True, torch.bfloat16), (False, False, torch.float32)],
)
def test_the_copies_are_bf16_only_where_the_cpu_multiplies_it_natively(
    monkeypatch: pytest.MonkeyPatch, bf16: bool, amx: bool, expected: torch.dtype
) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert dense_batch.dense_dtype() == expected


def test_the_crossover_is_measured_once_per_model(
    demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def fake_crossover(layers: list[QuantizedLinear], denses: list[torch.Tensor]) -> int:
        calls.append(len(layers))
        return 8

    monkeypatch.setattr(dense_batch, "_crossover", fake_crossover)
    monkeypatch.setattr(dense_batch, "_measured", {})
    first = attach_dense_copies(_quantized(demo_model_dir), "auto", max_bytes=1 << 40)
    second = attach_dense_copies(_quantized(demo_model_dir), "auto", max_bytes=1 << 40)
    assert first.min_rows == second.min_rows == 8 and len(calls) == 1


def test_the_crossover_rule_on_timed_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The row count returned starts the dense side's winning run up to the largest count
    measured; a win below a loss does not count; no win at the top: no copy. A win is by the
    margin (1.2x): 1.1x as fast is a tie, and the kernels keep it."""
    layer = _layer("int4")
    dense = layer.weight.to(torch.bfloat16)

    def run(dense_wins: set[int]) -> int:
        def sweep(calls: list[tuple[Callable[..., torch.Tensor], torch.Tensor]]) -> float:
            call, x = calls[0]
            if isinstance(call, partial):  # the dense pass: 1.25x as fast, or only 1.1x
                return 0.8 if x.shape[0] in dense_wins else 0.91
            return 1.0

        monkeypatch.setattr(dense_batch, "_sweep_seconds", sweep)
        return dense_batch._crossover([layer], [dense])

    assert run({16, 32, 64}) == 16
    assert run({2, 16, 32, 64}) == 16
    assert run({2, 4, 8, 16, 32}) == 0
    assert run(set(dense_batch._ROWS)) == 2


def test_a_sweep_calls_every_layer_once_a_pass_and_reports_the_median() -> None:
    """One warm-up pass, then `_REPEATS` timed passes, each calling every layer once with its
    own input; the median of the timed passes is what the crossover compares."""
    calls: list[int] = []
    inputs = [torch.zeros(2, 4), torch.zeros(3, 4)]

    def layer(i: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def call(x: torch.Tensor) -> torch.Tensor:
            assert x is inputs[i]
            calls.append(i)
            return x

        return call

    seconds = dense_batch._sweep_seconds([(layer(0), inputs[0]), (layer(1), inputs[1])])
    assert calls == [0, 1] * (1 + dense_batch._REPEATS)
    assert seconds >= 0.0


def test_engine_config_refuses_unknown_modes() -> None:
    from runtime.engine.config import EngineConfig

    with pytest.raises(ConfigError, match="dense_batch_weights"):
        EngineConfig(dense_batch_weights="always")
    with pytest.raises(ConfigError, match="dense_batch_min_rows"):
        EngineConfig(dense_batch_min_rows=-1)


def test_an_engine_serves_with_the_copies(demo_model_dir: Callable[[str], Path]) -> None:
    """With min_rows 3, the prefills and the batch of 3 decodes run the copies, a lone decode the
    kernels. Teacher-forced, the prompts' log-probabilities (computed by the prefills) follow a
    run on the kernels alone within the copy's bf16 rounding. The greedy tokens are not
    compared: the tiny random model's top logits can sit within that rounding of each other."""
    from runtime.engine.engine import Engine, EngineConfig
    from runtime.engine.request import GenerationRequest
    from runtime.engine.sampling import SamplingParams

    path = demo_model_dir("llama")
    prompts = [[5, 17, 42, 99, 3, 8, 11, 12], [7, 8, 9, 10, 11, 12, 13, 14], [1, 2, 3]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, prompt_logprobs=0)
    results: dict[int, list[list[float]]] = {}
    for rows in (0, 3):
        loaded = load_model(path, device="cpu", quantization="int4", quantize_lm_head=True)
        seen: list[int] = []
        head = loaded.model.lm_head
        head.register_forward_pre_hook(
            lambda _m, args, seen=seen: seen.append(args[0].reshape(-1, args[0].shape[-1]).shape[0])
        )
        config = EngineConfig(
            model_name="t",
            device="cpu",
            max_num_seqs=3,
            min_num_seqs=3,
            initial_num_seqs=3,
            batch_warmup=False,
            dense_batch_weights="off" if rows == 0 else "on",
            dense_batch_min_rows=rows,
        )
        engine = Engine(config, loader=lambda loaded=loaded: loaded)
        try:
            handles = [
                engine.submit(GenerationRequest(f"r{i}", p, params)) for i, p in enumerate(prompts)
            ]
            outs = [h.result() for h in handles]
        finally:
            engine.shutdown()
        assert all(len(out.token_ids) == 6 for out in outs)
        results[rows] = [[e.logprob for e in out.prompt_logprobs[1:]] for out in outs]  # type: ignore[index]

        assert all((m.dense is not None) == bool(rows) for m in _layers(loaded.model))
        assert max(seen) >= 3  # some head call had rows enough for the copy
    for kernel, dense in zip(results[0], results[3], strict=True):
        assert len(dense) == len(kernel) > 0 and dense != kernel  # a different kernel ran
        assert dense == pytest.approx(kernel, abs=0.05)
