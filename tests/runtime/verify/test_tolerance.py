"""The tolerance rule (runtime.verify.tolerance): spacings checked against torch's own
`nextafter` for each dtype, and the logit's tolerance growing with its magnitude."""

from __future__ import annotations

import math

import pytest
import torch

from runtime.verify.tolerance import (
    INT8_BLOCKS,
    LOGIT_ULPS,
    chain_dtype,
    default_threshold,
    logit_tolerance,
    ulp,
)

VALUES = (0.0, 1e-40, 1e-6, 0.3, 1.0, 1.5, 17.6, 31.99, 32.0, 33.8, -29.1, 1000.0, 60000.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("value", VALUES)
def test_ulp_is_the_gap_to_the_next_value(dtype: torch.dtype, value: float) -> None:
    x = torch.tensor(value, dtype=dtype).abs()  # rounded into the dtype, as a logit would be
    up = torch.nextafter(x, torch.tensor(math.inf, dtype=dtype))
    assert ulp(dtype, float(x)) == float(up) - float(x)
    assert ulp(str(dtype), float(x)) == ulp(dtype, float(x))  # "torch.bfloat16" as well


def test_bf16_spacing_where_smollm2_logits_lie() -> None:
    """The issue's case: logits near 32 come out of bf16, whose spacing is 0.125 below 32."""
    assert ulp("bfloat16", 31.0) == 0.125 and ulp("bfloat16", 33.0) == 0.25
    base = default_threshold("float32", "int4")
    assert logit_tolerance(base, "bfloat16", 31.0) == base + LOGIT_ULPS * 0.125
    assert logit_tolerance(base, "bfloat16", -31.0) == logit_tolerance(base, "bfloat16", 31.0)
    # fp32 adds next to nothing: an unquantized fp32 model keeps its 1e-3
    assert logit_tolerance(1e-3, "float32", 31.0) == pytest.approx(1e-3, rel=1e-2)


def test_a_non_finite_reference_keeps_the_base() -> None:
    assert logit_tolerance(0.05, "bfloat16", math.nan) == 0.05
    assert logit_tolerance(0.05, "bfloat16", math.inf) == 0.05


def test_chain_dtype_is_bf16_once_a_quantized_kernel_runs() -> None:
    assert chain_dtype(torch.float32, is_quantized=True) == "bfloat16"
    assert chain_dtype(torch.float32, is_quantized=False) == "float32"
    assert chain_dtype(torch.float16, is_quantized=True) == "float16"
    assert chain_dtype("bfloat16", is_quantized=False) == "bfloat16"


def test_the_avx2_kernels_chain_is_four_bf16_spacings_a_step() -> None:
    """A quantized model on runtime.models.cpu_kernels's kernels (int8 activations in blocks of
    32) gets the coarser chain, 6 significant bits: each of its spacings is four of bf16's."""
    assert chain_dtype(torch.float32, is_quantized=True, int8_activations=True) == INT8_BLOCKS
    assert chain_dtype(torch.float32, is_quantized=False, int8_activations=True) == "float32"
    for value in (0.3, 9.18, 31.0, 33.0):
        assert ulp(INT8_BLOCKS, value) == 4 * ulp("bfloat16", value)
