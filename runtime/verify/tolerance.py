"""What a verified value may stray from its reference before it counts as an anomaly.

Two parts (docs/verification.md):

* a **base** per serving dtype and weight quantization, absolute (`default_threshold`): what the
  per-op probes, whose scalars are normalised to about [-1, 1] (runtime.verify.probes), are
  checked against, and the floor of every tolerance;
* for the **logit** probe, plus `LOGIT_ULPS` spacings of the production chain's coarsest dtype at
  the expected value (`logit_tolerance`). A logit is not normalised: SmolLM2's run near 30, where
  bf16 values lie 0.125 apart. Weight-only quantized kernels read and write bf16
  (runtime.models.quant), and each rounding of a kernel whose fp32 accumulation order differs
  from the reference's flips single elements by a whole bf16 spacing; the flips propagate through
  the layers, so the logit of a healthy int4 model differs from the fp32 reference by about one
  or two bf16 spacings at its own magnitude, whatever the reference does before its last step.
  Replaying the kernels' roundings in the reference (same codes, inputs and outputs rounded to
  bf16) was measured and did not shrink it (SmolLM2 int4 + int8 head, 30 requests: largest error
  0.24 replayed vs 0.17 not): the divergence is rounding noise amplified layer after layer, not
  a missing cast. A broken kernel writes values off by whole units, far above either part.
  On AVX2 CPUs the quantized layers run kernels of our own (runtime.models.cpu_kernels) that
  round the activations to int8 in blocks of 32 instead: a coarser chain (`INT8_BLOCKS`).

Pure Python (no torch): storage and the CLI import it to read and explain thresholds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.config import Settings

__all__ = [
    "DEFAULT_THRESHOLDS",
    "INT8_BLOCKS",
    "LOGIT_ULPS",
    "QUANTIZED_THRESHOLDS",
    "anomaly_threshold",
    "chain_dtype",
    "default_threshold",
    "logit_tolerance",
    "ulp",
]

# absolute error per serving dtype (the reference path is always fp32): fp32 1e-3; fp16 1e-2
# (10-bit mantissa); bf16 5e-2 (7-bit mantissa)
DEFAULT_THRESHOLDS: dict[str, float] = {"float32": 1e-3, "float16": 1e-2, "bfloat16": 5e-2}

# weight-only quantized linears run their kernels on bf16 activations (runtime.models.quant), so
# their production values carry bf16-class rounding against the fp32 reference computed with the
# same dequantized weights; fp8 also rounds the activations to e4m3 (3 mantissa bits)
QUANTIZED_THRESHOLDS: dict[str, float] = {"int8": 5e-2, "int4": 5e-2, "fp8": 0.5}

# spacings of the chain dtype a healthy logit may be off by. Measured on SmolLM2-135M with int4
# layers and an int8 head (300 greedy requests): at most 1.9 spacings beyond the base; 4 leaves
# room for the tail while a corrupted kernel's error (units) stays far above it
LOGIT_ULPS = 4.0

# the chain of runtime.models.cpu_kernels's kernels, which round each block of 32 activations to
# int8 against the block's largest (7 bits and a sign a value, relative to the block, not to the
# value). Measured on SmolLM2-135M int4 + int8 head, 48 requests of test_quantized_real, the same
# requests on both kernels: at most 6.7 bf16 spacings beyond the base on these kernels against
# 2.65 on torch's (bf16). Modelled as 6 significant bits: LOGIT_ULPS of them are 16 bf16
# spacings, ~2.4x the largest seen (bf16's 4 against 1.9: ~2.1x), and a corrupted kernel's
# units still stand far above it (tested)
INT8_BLOCKS = "int8_blocks"

# significand bits (with the implicit one) and the smallest normal exponent (frexp's convention)
_FORMATS: dict[str, tuple[int, int]] = {
    "float32": (24, -125),
    "float16": (11, -13),
    "bfloat16": (8, -125),
    INT8_BLOCKS: (6, -125),
}


def _name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def ulp(dtype: object, value: float) -> float:
    """The spacing of `dtype`'s values at |value| (the gap to the next representable value away
    from zero); the subnormal spacing below the smallest normal."""
    bits, min_exp = _FORMATS[_name(dtype)]
    if not math.isfinite(value):
        return math.inf
    _, exp = math.frexp(abs(value))  # |value| = m * 2**exp, m in [0.5, 1); 0 -> exp 0
    if value == 0.0:
        exp = min_exp
    return math.ldexp(1.0, max(exp, min_exp) - bits)


def default_threshold(dtype: str, quantization: str | None = None) -> float:
    """Absolute-error threshold for a serving dtype ("float32" | "float16" | "bfloat16") and
    weight quantization (None/"none", "int8", "int4", "fp8"): the looser of the two."""
    threshold = DEFAULT_THRESHOLDS[_name(dtype)]
    if quantization and quantization != "none":
        threshold = max(threshold, QUANTIZED_THRESHOLDS[quantization])
    return threshold


def anomaly_threshold(settings: Settings) -> float:
    """A server's base threshold: `verify_threshold` when set, else the default for its dtype
    and quantization."""
    if settings.verify_threshold is not None:
        return settings.verify_threshold
    return default_threshold(settings.dtype, settings.quantization)


def chain_dtype(dtype: object, *, is_quantized: bool, int8_activations: bool = False) -> str:
    """The coarsest dtype a production value passes through: bf16 once any weight-only
    quantized kernel runs (they read and write bf16), `INT8_BLOCKS` where the model's layers
    run runtime.models.cpu_kernels's kernels (`int8_activations`), else the serving dtype."""
    name = _name(dtype)
    if is_quantized and int8_activations:
        return INT8_BLOCKS
    if is_quantized and name == "float32":
        return "bfloat16"
    return name


def logit_tolerance(base: float, dtype: object, expected: float) -> float:
    """The logit probe's tolerance: `base` + LOGIT_ULPS spacings of `dtype` at |expected|."""
    if not math.isfinite(expected):  # a NaN or inf reference is an anomaly whatever the bound
        return base
    return base + LOGIT_ULPS * ulp(dtype, expected)
