"""The cumulative logprob that ranks `best_of` sequences: the model's own log-probability of each
sampled token (log-softmax of the fp32 logits, before temperature and top-k/p, as vLLM ranks).

Computed only for rows of requests with best_of > n; a batch without one pays one Python check per
row. The sampled-logprobs work of the logprobs API may replace this with its own values.
"""

from __future__ import annotations

import torch

from runtime.engine.sequence import Sequence

__all__ = ["add_sampled_logprobs"]


def add_sampled_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, seqs: list[Sequence]
) -> None:
    """logits [N, vocab] float32, token_ids [N]: adds each ranked row's logprob to its sequence."""
    rows = [i for i, seq in enumerate(seqs) if seq.request.sampling.ranks_choices]
    if not rows:
        return
    index = torch.tensor(rows, device=logits.device)
    picked = logits.index_select(0, index).float().log_softmax(dim=-1)  # [R, vocab]
    chosen = picked.gather(1, token_ids.index_select(0, index).unsqueeze(1)).squeeze(1)  # [R]
    for row, value in zip(rows, chosen.tolist(), strict=True):
        seqs[row].cumulative_logprob += value
