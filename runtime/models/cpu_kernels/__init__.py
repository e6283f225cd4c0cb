"""Batch-1 decode kernels of our own for AVX2 CPUs without AVX-512: int4 and int8 GEMMs
(gemv.cpp), the attention of one token over its run of pages (attend.cpp), and a quantized
llama-family model's whole decoder stack for one token in one call (stack.cpp, packed by
stack.py); kernels.h declares what they share, vec.h the AVX2 helpers.

Why: torch's weight-only CPU kernels (`_weight_int4pack_mm_for_cpu`, `_weight_int8pack_mm`) are
fast where AVX-512 is (1.18x llama.cpp's whole step on a Sapphire Rapids, docs/performance.md)
but slow on an AVX2-only CPU: measured on a 2-core AMD EPYC (AVX2, FMA, F16C; no AVX-512), one
thread, SmolLM2-135M's 30 layers of projections plus its int8 LM head at batch 1, 27-35 ms
against llama.cpp's whole decode step of 13 ms; and they take bf16 activations, which such a CPU
converts in software. These kernels do what llama.cpp's AVX2 dot products do: the activations
are quantized to int8 in blocks of 32 and each block's dot product is integer multiply-adds (one
`maddubs` for 32 products). The extra rounding of the activations costs accuracy: ~0.6% relative
RMS error of a layer's output against the dequantized reference on random inputs, against
~0.2% for torch's kernels (bf16 activations); llama.cpp makes the same trade.

Used for every call of a CPU layer when `enabled()`: the setting FASTLLM_CPU_KERNELS=auto
(default: where the CPU has AVX2, FMA and F16C and no AVX-512) | on | off. A layer packs its
weights for them at construction (`pack_int4`, `pack_int8`). A call of many rows (a prefill, a
batched step) turns the loops round: each tile of four weight rows is read (and, for int4,
unpacked) once into L1 and serves every row of x (gemv.cpp's int4_many), so the weights stream
from memory once a call, not once a row; a row's result is bit for bit the one-row call's.
Its per-row scale and zero setup runs eight rows a vector and its products two rows of x at a
time (gemv.cpp says how the bits stay the one-row call's). Measured on the 2-core EPYC, 1
thread, hot weights, 32 rows: 0.30 ms for a 576 x 576 int4 projection against 0.35 ms for MKL's
fp32 GEMM on the dequantized copy (which reads 8x the bytes when cold); 0.43 ms before the setup
was vectorized. The dense copies (runtime.models.dense_batch) still take calls of many rows
where they measure 1.2x as fast at load.

The C++ source is compiled once per machine by torch's extension builder (ninja, a C++
compiler; ~20 s) into its cache (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions):
`python -m runtime.models.cpu_kernels` does it ahead (`make setup` runs it); otherwise the first
quantized layer built does. A build that fails (no compiler) logs why once and every layer stays
on torch's kernels: never a failed load.

`torch.ops.fastllm_cpu.decode_attend(q [1, Hq, D], k, v [1, Hkv, D], pool, pages, past)`
(attend.cpp): a lone sequence's one-token decode step over its page table, in any order
(runtime.models.batch_plan's `fused_decode`, `lone_pages`; fp32 models, decided at load by
runtime.models.loader), the pool one layer's [2, Hkv, pages, page_size, D], written in place: the
new K/V stored and the attention of every query head in one call. On such a CPU each torch op
costs 3-10 us, and the eager path runs ~12 of them a layer (the writes, views, SDPA) for what is
a few microseconds of work at a short context. It computes what `ops.attention` does, in fp32
with its own order of summation (differences in the last bits).

`torch.ops.fastllm_cpu.decode_attend_rows(q [B, Hq, D], k, v [B, Hkv, D], pool, pages, starts,
pasts)` (attend.cpp): the same for a decode step of B sequences, one new token each (batch_plan's
`fused_rows`): the rows' tables one after another (`starts`), every row's K/V stored, then every
(row, query head) attends, split across threads. The layer path's writes, page gathers into a
padded batch, masks and SDPA took ~30% of a 32-row decode step of SmolLM2-135M on the AVX2 EPYC
(a step 225 -> 160 ms). Each row's output is bit for bit its own decode_attend call's.

`torch.ops.fastllm_cpu.decode_stack(x, weights, counts, cos, sin, pool, pages, past,
num_heads, intermediate, eps)` (stack.cpp): the same lone one-token step through every layer
(norms, projections, rotary, attention, SwiGLU, residual adds) with no torch op between them;
used where every projection of the model is on these kernels (cpu_kernels.stack says which).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from runtime.errors import ConfigError

__all__ = [
    "build_error",
    "cpu_has",
    "enabled",
    "int4_mm",
    "int8_mm",
    "pack_int4",
    "pack_int8",
    "unpack_int4",
]

log = logging.getLogger(__name__)

BLOCK = 32  # input features per activation scale, and per int4 weight scale
_SOURCES = [str(Path(__file__).with_name(name)) for name in ("gemv.cpp", "attend.cpp", "stack.cpp")]
_FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"]
MODES = ("auto", "on", "off")

_lock = threading.Lock()
_built: bool | None = None  # None: not tried yet
_error: str | None = None


def _mode() -> str:
    mode = os.environ.get("FASTLLM_CPU_KERNELS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ConfigError(
            f"FASTLLM_CPU_KERNELS must be one of {', '.join(MODES)}; got {mode!r}",
            param="FASTLLM_CPU_KERNELS",
        )
    return mode


def cpu_has(*features: str) -> bool:
    """Whether the CPU has any of `features`, torch's probes by name ("avx2", "avx512",
    "avx512_bf16", "amx_tile": `torch.cpu._is_<name>_supported`; a name this torch lacks: no)."""
    cpu: Any = torch.cpu
    return any(bool(getattr(cpu, f"_is_{name}_supported", lambda: False)()) for name in features)


def cpu_supports() -> bool:
    """AVX2: the kernels are compiled for AVX2, FMA and F16C, which every AVX2 CPU of Intel
    (Haswell on) and AMD (Zen on) also has."""
    return cpu_has("avx2")


def enabled() -> bool:
    """Whether new CPU layers pack for these kernels (FASTLLM_CPU_KERNELS, module doc); builds the
    kernels on first use."""
    mode = _mode()
    if mode == "off" or not cpu_supports():
        return False
    if mode == "auto" and cpu_has("avx512"):  # torch's kernels are fast there
        return False
    return _ensure_built()


def build_error() -> str | None:
    """Why the kernels could not be built here, or None (built, or not tried)."""
    return _error


def _ensure_built() -> bool:
    global _built, _error
    with _lock:
        if _built is None:
            try:
                from torch.utils import cpp_extension

                # debug: the start's log is one line a phase (a first build takes ~20 s)
                log.debug("loading the AVX2 kernels")
                cpp_extension.load(
                    name="fastllm_cpu_kernels_v1",
                    sources=_SOURCES,
                    extra_cflags=_FLAGS,
                    is_python_module=False,
                    verbose=False,
                )
                _register_fakes()
                _built = True
            except Exception as exc:  # no compiler, no ninja, a compile error: torch's kernels
                _built, _error = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                log.warning("AVX2 kernels unavailable; torch's kernels and ops run (%s)", _error)
        return _built


def _register_fakes() -> None:
    """Output shapes for tracing, so a compiled graph (runtime.models.fast.cpu_step) calls the
    kernels as opaque ops."""

    @torch.library.register_fake("fastllm_cpu::int4_mm")
    def _int4(x: Tensor, codes: Tensor, scales: Tensor, zeros: Tensor) -> Tensor:
        return x.new_empty(x.shape[0], codes.shape[0])

    @torch.library.register_fake("fastllm_cpu::int8_mm")
    def _int8(x: Tensor, codes: Tensor, scales: Tensor) -> Tensor:
        return x.new_empty(x.shape[0], codes.shape[0])


def pack_int4(codes: Tensor, scales: Tensor, zeros: Tensor, group_size: int) -> tuple[Tensor, ...]:
    """codes int [out, in] 0..15, scales/zeros [out, in / group] fp32 (w = (q - 8) s + z) ->
    the kernel's (codes [out, in / 2] uint8, scales and zeros [out, in / 32] float16), or ()
    where the layout cannot hold the layer (a group not a multiple of 32, rows not a multiple
    of 4 (torch's int4 layers have multiples of 16), a scale beyond
    float16's range: the layer keeps torch's kernel). float16 holds the bf16-exact scales
    exactly in its normal range; a zero within 6e-5 of 0 is rounded to float16's subnormals
    (an error of at most 3e-8 a weight, far below the activations' int8 rounding)."""
    out_f, in_f = codes.shape
    if group_size % BLOCK or in_f % BLOCK or out_f % 4 or codes.device.type != "cpu":
        return ()
    per = group_size // BLOCK
    s16 = scales.float().repeat_interleave(per, 1).half()
    z16 = zeros.float().repeat_interleave(per, 1).half()
    if not (torch.isfinite(s16).all() and torch.isfinite(z16).all()):
        return ()
    c = codes.to(torch.uint8).view(out_f, in_f // BLOCK, BLOCK)
    # byte i of a block: feature i in the low nibble, feature i + 16 in the high one
    blocks = c[..., : BLOCK // 2] | (c[..., BLOCK // 2 :] << 4)  # [out, blocks, 16]
    return _tiled(blocks).view(out_f, in_f // 2), _tiled(s16), _tiled(z16)


def _tiled(t: Tensor) -> Tensor:
    """[out, blocks, ...] -> the same values tile by tile (4 rows), block by block, row by row,
    as [out, blocks * ...]: the order the kernel streams them in (gemv.cpp, int4_mm)."""
    out_f, blocks = t.shape[:2]
    tiles = t.reshape(out_f // 4, 4, blocks, -1).transpose(1, 2)  # [tiles, blocks, 4, ...]
    return tiles.contiguous().view(out_f, -1)


def unpack_int4(packed: Tensor) -> Tensor:
    """`pack_int4`'s codes [out, in / 2] back to int32 codes [out, in]."""
    out_f, half = packed.shape
    blocks = half // (BLOCK // 2)
    tiles = packed.view(out_f // 4, blocks, 4, BLOCK // 2).transpose(1, 2)
    rows = tiles.reshape(out_f, blocks, BLOCK // 2)
    both = torch.cat([rows & 0xF, rows >> 4], dim=-1)  # features i, then i + 16
    return both.reshape(out_f, half * 2).to(torch.int32)


def pack_int8(codes: Tensor, scales: Tensor) -> tuple[Tensor, ...]:
    """int8 codes [out, in] and fp32 scales [out] as the kernel reads them (shared, not copied),
    or () where in_features is not a multiple of 32."""
    if codes.shape[1] % BLOCK or codes.device.type != "cpu":
        return ()
    return codes.contiguous(), scales.float().contiguous()


def int4_mm(x: Tensor, packed: tuple[Tensor, ...]) -> Tensor:
    """x [rows, in] -> [rows, out] fp32."""
    return torch.ops.fastllm_cpu.int4_mm(x.float().contiguous(), *packed)


def int8_mm(x: Tensor, packed: tuple[Tensor, ...]) -> Tensor:
    return torch.ops.fastllm_cpu.int8_mm(x.float().contiguous(), *packed)
