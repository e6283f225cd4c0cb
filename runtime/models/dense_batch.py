"""Dense bf16 (or fp32) copies of the quantized projections, for steps with many rows (CPU).

Why: torch's weight-only int4 and int8 CPU kernels are GEMVs at heart. At batch 1 they beat a
dense GEMM because they read a quarter (int4) or half (int8) of the bytes. Their cost then grows
almost linearly with the rows, while a bf16 GEMM on AMX tiles barely grows. Measured on this
project's CPU (Sapphire Rapids, 2 threads, SmolLM2-135M's projections, one step of 30 layers):

    rows              1      8     32     64
    int4 kernel    7.1   19.0   56.7  105.3 ms
    bf16 dense    15.1   15.0   22.4   29.0 ms
    (the int8 LM head, 49152 x 576: 1.1 / 4.0 / 15.8 ms; in bf16 2.0 / 2.3 / 3.7 ms)

A decode step of 32 sequences is such a call, and so is every prefill. So a quantized layer may
keep, beside its codes, its dequantized weight in bf16 (`QuantizedLinear.dense`), and a call with
at least `dense_min_rows` rows runs the dense GEMM on it. Batch-1 decode, the case quantization
is for, always stays on the quantized kernel.

`dense_batch_weights` (settings): `auto` attaches the copies on CPU when their bytes fit
`dense_batch_max_bytes`, and only when a measured crossover exists: a pass over every quantized
layer is timed at load on both kernels at 2..64 rows (weights streamed from memory, as a step
reads them), and the copies run from the smallest row count at which the dense pass is 1.2x
as fast there and at every larger count measured (a margin: near a tie the choice would follow
the machine's noise). `on` ignores the byte bound; `off` keeps the quantized kernels for every
call. `dense_batch_min_rows` > 0 skips the
measurement (fixed, reproducible behaviour for tests and for operators who measured). No copies
under tensor parallelism (each rank would decide on its own shard) nor with `compile=on` (the
row-count branch would be a guard in the compiled graphs, so a step past it would recompile on
a request); `compile=auto` compiles nothing on a CPU.

The copy is the layer's own dequantized weight rounded to bf16 (the kernel's activations are
bf16 already), so a batched step computes with the same weights up to that rounding; on a CPU
without native bf16 (no AVX-512 BF16, no AMX) the copy is fp32 instead (`dense_dtype`): there
bf16 GEMMs are converted in software and slower than the quantized kernels. The copies' bytes
are reported beside the codes (`weight_bytes_by_format`, key `dense`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from runtime.models import cpu_kernels
from runtime.models.quant import Int4Linear, Int8Linear, QuantizedLinear

__all__ = ["DENSE_MODES", "DenseBatchReport", "attach_dense_copies"]


DENSE_MODES = ("auto", "on", "off")
_ROWS = (2, 4, 8, 16, 32, 64)  # the row counts the crossover is measured at (prefills beyond)
_REPEATS = 3
# the copies must win by this factor: near a tie the choice would follow the machine's noise from
# one load to the next (the tiny test models' passes take microseconds either way)
_MARGIN = 1.2
# (the layers' shapes and formats, threads) -> crossover rows, or 0 for none: a process that
# loads the same model again (replicas, offline engines, tests) does not measure again
_measured: dict[tuple[object, ...], int] = {}


@dataclass(frozen=True)
class DenseBatchReport:
    """What `attach_dense_copies` decided, for the load log and the model's status."""

    mode: str
    num_layers: int = 0  # layers that got a copy
    bytes: int = 0  # the copies' bytes
    min_rows: int = 0  # rows from which a call runs the copy
    reason: str = ""  # why no copy was attached, when none was
    seconds: float = 0.0  # the measurement's time


def dense_dtype() -> torch.dtype:
    """bf16 where the CPU multiplies it natively (AVX-512 BF16 or AMX), else fp32: an AVX2 CPU
    converts bf16 in software. Measured on a 2-core AMD EPYC (SmolLM2-135M int4, 1 thread): bf16
    copies were never 1.2x as fast as the int4 kernel up to 64 rows, fp32 copies were from 32."""
    return torch.bfloat16 if cpu_kernels.cpu_has("avx512_bf16", "amx_tile") else torch.float32


def _quantized_layers(model: nn.Module) -> list[Int8Linear | Int4Linear]:
    """The layers on torch's int8 / int4 CPU kernels (fp8 runs on CUDA only)."""
    return [m for m in model.modules() if isinstance(m, Int8Linear | Int4Linear)]


def _sweep_seconds(calls: Sequence[tuple[Callable[[Tensor], Tensor], Tensor]]) -> float:
    """Median time of one pass over every layer, as a step makes it: each layer's weights come
    from memory, not from a cache a repeated call on one layer would keep them in (measured:
    that bias made an 8-row step pick the copies and run 15% slower)."""

    def sweep() -> None:
        for call, x in calls:
            call(x)

    sweep()  # the first pass pays one-off costs (oneDNN's kernel generation)
    samples = []
    for _ in range(_REPEATS):
        start = time.perf_counter()
        sweep()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _crossover(layers: Sequence[QuantizedLinear], denses: Sequence[Tensor]) -> int:
    """The smallest measured row count from which a pass over the dense copies is `_MARGIN`
    times faster than one over the quantized kernels, at that count and every larger one
    measured; 0: none."""
    faster: list[bool] = []
    for n in _ROWS:
        inputs = {
            k: torch.randn(n, k, dtype=denses[0].dtype) for k in {m.in_features for m in layers}
        }
        quantized = [(m.kernel_forward, inputs[m.in_features]) for m in layers]
        dense = [
            (partial(nn.functional.linear, weight=w), inputs[m.in_features])
            for m, w in zip(layers, denses, strict=True)
        ]
        faster.append(_sweep_seconds(dense) * _MARGIN < _sweep_seconds(quantized))
    best = 0
    for n, ok in zip(reversed(_ROWS), reversed(faster), strict=True):
        if not ok:
            break
        best = n
    return best


def attach_dense_copies(
    model: nn.Module,
    mode: str,
    *,
    max_bytes: int,
    min_rows: int = 0,
    tensor_parallel: bool = False,
    compiled: bool = False,
) -> DenseBatchReport:
    """Give the model's quantized CPU layers a dense bf16 copy for calls of many rows (module
    doc). Layers that already have one (an earlier engine on the same weights) keep it, unless
    this engine's settings rule the copies out: then they are dropped."""
    if mode not in DENSE_MODES:
        raise ValueError(f"dense_batch_weights must be one of {DENSE_MODES}, got {mode!r}")
    layers = _quantized_layers(model)
    dtype = dense_dtype()
    size = torch.finfo(dtype).bits // 8
    total = sum(layer.in_features * layer.out_features * size for layer in layers)
    reason = ""
    if mode == "off":
        reason = "off"
    elif not layers:
        reason = "no quantized layers"
    elif tensor_parallel:  # every rank would have to make the same choice on its own shard
        reason = "tensor parallel"
    elif compiled:  # a row-count branch in a traced graph is a guard: a recompile on a request
        reason = "compile=on: the compiled step runs the kernels"
    elif any(layer.packed_device.type != "cpu" for layer in layers):
        reason = "not on CPU"
    elif mode == "auto" and total > max_bytes:
        reason = f"the copies' {total} bytes exceed dense_batch_max_bytes={max_bytes}"
    if reason:
        for layer in layers:
            layer.dense, layer.dense_min_rows = None, 0
        return DenseBatchReport(mode, reason=reason)
    start = time.perf_counter()
    with torch.inference_mode():
        have = [layer for layer in layers if layer.dense is not None]
        if have:  # attached by an earlier engine on the same weights
            rows = have[0].dense_min_rows
        else:
            shapes = tuple((m.in_features, m.out_features, m.method) for m in layers)
            key: tuple[object, ...] = (shapes, torch.get_num_threads(), dtype)
            rows = min_rows if min_rows > 0 else _measured.get(key, -1)
            # no copies measured faster already: not dequantized again (2 s a load of a 135M
            # model on a 2-core CPU, paid by every offline engine before)
            denses = [layer.weight.to(dtype).contiguous() for layer in layers] if rows else []
            if rows < 0:
                rows = _measured[key] = _crossover(layers, denses)
            if rows > 0:
                for layer, dense in zip(layers, denses, strict=True):
                    layer.attach_dense(dense, rows)
    num = sum(1 for layer in layers if layer.dense is not None)
    nbytes = sum(layer.dense.nbytes for layer in layers if layer.dense is not None)
    seconds = time.perf_counter() - start
    reason = "" if num else f"the copies were not {_MARGIN}x as fast at {_ROWS[-1]} rows"
    return DenseBatchReport(mode, num, nbytes, rows if num else 0, reason, seconds)
