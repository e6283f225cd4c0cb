"""`min_tokens` (vLLM's extension): until a row has that many completion tokens, the tokens that
would stop it (eos unless ignore_eos, and stop_token_ids) cannot be sampled."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["mask_stop_tokens"]


def mask_stop_tokens(
    logits: torch.Tensor,  # [n, vocab]: only the rows still under their minimum; in place
    stop_ids: Sequence[Sequence[int]],
) -> None:
    vocab = logits.shape[-1]
    pairs = [(row, t) for row, ids in enumerate(stop_ids) for t in ids if t < vocab]
    if not pairs:
        return
    rows = torch.tensor([row for row, _ in pairs], device=logits.device)
    tokens = torch.tensor([t for _, t in pairs], device=logits.device)
    logits[rows, tokens] = float("-inf")
