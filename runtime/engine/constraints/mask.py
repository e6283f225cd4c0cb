"""The two calls `ModelRunner.execute` makes for constrained rows: mask before sampling, advance
after. Unconstrained rows are untouched: the bitmask covers only the constrained rows' indices,
and a batch without any costs one scan of the list.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import torch
import xgrammar as xgr

if TYPE_CHECKING:
    from runtime.engine.sequence import Sequence

__all__ = ["accept_sampled", "apply_constraint_masks"]


def apply_constraint_masks(logits: torch.Tensor, seqs: Seq[Sequence]) -> None:
    """logits [N, vocab] (row i samples seqs[i]): tokens each constrained row's grammar forbids
    next are set to -inf, in place, in one batched kernel call."""
    rows = [i for i, seq in enumerate(seqs) if seq.constraint is not None]
    if not rows:
        return
    vocab = logits.shape[-1]
    bitmask = xgr.allocate_token_bitmask(len(seqs), vocab)  # [N, ceil(vocab / 32)] int32, all ones
    for i in rows:
        seq = seqs[i]
        state = seq.constraint
        assert state is not None
        state.sync(len(seq.output_token_ids))
        state.fill(bitmask, i)
    xgr.apply_token_bitmask_inplace(
        logits, bitmask.to(logits.device, non_blocking=True), vocab_size=vocab, indices=rows
    )


def accept_sampled(seqs: Seq[Sequence], token_ids: Seq[int]) -> None:
    """Advance each constrained row's matcher with the token it sampled."""
    for seq, token_id in zip(seqs, token_ids, strict=True):
        if seq.constraint is not None:
            seq.constraint.accept(token_id)
