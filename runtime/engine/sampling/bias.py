"""`logit_bias` (OpenAI): a per-token value added to the logits of the rows that send one."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["apply_logit_bias"]


def apply_logit_bias(
    logits: torch.Tensor,  # [n, vocab]: only the biased rows; changed in place
    biases: Sequence[Sequence[tuple[int, float]]],
) -> None:
    rows = [row for row, pairs in enumerate(biases) for _ in pairs]
    tokens = [token_id for pairs in biases for token_id, _ in pairs]
    values = [value for pairs in biases for _, value in pairs]
    device = logits.device
    index = (torch.tensor(rows, device=device), torch.tensor(tokens, device=device))
    logits.index_put_(index, torch.tensor(values, dtype=logits.dtype, device=device), True)
