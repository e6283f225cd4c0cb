"""The transposed-weight Linear: same numbers as nn.Linear, checkpoint names unchanged."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from runtime.models.layers import Linear


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 8, 33])
def test_matches_nn_linear_loaded_from_its_state_dict(bias: bool, rows: int) -> None:
    torch.manual_seed(rows)
    reference = nn.Linear(24, 40, bias=bias)
    ours = Linear(24, 40, bias)
    ours.load_state_dict(reference.state_dict(), strict=True)  # keys "weight" (+ "bias")
    assert ours.weight_t.shape == (24, 40) and ours.weight_t.is_contiguous()
    assert torch.equal(ours.weight, reference.weight)  # the [out, in] view
    x = torch.randn(rows, 24)
    torch.testing.assert_close(ours(x), reference(x), rtol=1e-5, atol=1e-6)
    x3 = torch.randn(2, rows, 24)  # leading batch dims take the matmul path
    torch.testing.assert_close(ours(x3), reference(x3), rtol=1e-5, atol=1e-6)


def test_strict_load_without_a_weight_fails() -> None:  # the loader names HF tensors first
    with pytest.raises(RuntimeError, match="weight_t"):
        Linear(4, 8, False).load_state_dict({}, strict=True)
