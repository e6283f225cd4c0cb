"""Presence, frequency (OpenAI) and repetition (vLLM's extension) penalties, in place on the rows
that ask for one. As vLLM applies them: repetition divides a positive logit (multiplies a negative
one) of every token seen in the prompt or the output; frequency subtracts `penalty × count` and
presence `penalty × [count > 0]` for the output tokens only."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["apply_penalties"]


def _counts(token_lists: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[n, vocab] occurrence counts of each row's tokens, in one bincount over offset ids."""
    flat = [row * vocab + t for row, tokens in enumerate(token_lists) for t in tokens]
    ids = torch.tensor(flat, dtype=torch.long, device=device)
    return torch.bincount(ids, minlength=len(token_lists) * vocab).view(len(token_lists), vocab)


def apply_penalties(
    logits: torch.Tensor,  # [n, vocab] float32: only the penalized rows; changed in place
    outputs: Sequence[Sequence[int]],
    prompts: Sequence[Sequence[int]],
    presence: Sequence[float],
    frequency: Sequence[float],
    repetition: Sequence[float],
) -> None:
    vocab, device = logits.shape[-1], logits.device
    output_counts = _counts(outputs, vocab, device).to(logits.dtype)
    if any(r != 1.0 for r in repetition):
        seen = (_counts(prompts, vocab, device) > 0) | (output_counts > 0)
        rep = torch.tensor(repetition, dtype=logits.dtype, device=device).unsqueeze(-1)
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits.copy_(torch.where(seen, penalized, logits))
    freq = torch.tensor(frequency, dtype=logits.dtype, device=device).unsqueeze(-1)
    pres = torch.tensor(presence, dtype=logits.dtype, device=device).unsqueeze(-1)
    logits -= freq * output_counts + pres * (output_counts > 0).to(logits.dtype)
