"""Quantized linears on a CUDA device (`pytest -m cuda`): int8/int4 weight-only and fp8 W8A8
(compute capability >= 8.9) against the fp32 product with their own dequantized weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.models.quantize import quantize_linear

pytestmark = pytest.mark.cuda

# int8/int4 round activations to bf16; fp8 rounds them to e4m3 (3 mantissa bits)
REL_TOL = {"int8": 1e-2, "int4": 1e-2, "fp8": 1.5e-1}


@pytest.mark.parametrize("method", sorted(REL_TOL))
def test_quantized_linear_on_cuda(method: str) -> None:
    if method == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability >= 8.9")
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(1536, 576, generator=g).cuda()
    x = torch.randn(8, 576, generator=g).cuda()
    layer, report = quantize_linear("l", weight, None, method, group_size=32)
    expected = F.linear(x, layer.weight)
    got = layer(x)
    assert got.device.type == "cuda" and got.dtype == torch.float32
    assert (got - expected).abs().max() <= REL_TOL[method] * expected.abs().max()
    assert report.weight_bytes < report.float_bytes / 3
