"""Logits processing before sampling, one small piece per control, each on only the rows that ask.

`process_logits(logits, seqs)` runs the pieces in vLLM's order (penalties, then logit_bias, then
the min_tokens mask, so a masked stop token stays masked) and changes `logits` in place, touching
only the rows of requests that use a control: a batch where no row asks costs one pass over the
rows' params and nothing on the device. Logprobs are read before this (runtime.engine.logprobs):
they are the model's own distribution. Another per-row mask (a grammar's token bitmask) is one
more piece called the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import torch

from runtime.engine.logits.bias import apply_logit_bias
from runtime.engine.logits.min_tokens import mask_stop_tokens
from runtime.engine.logits.penalties import apply_penalties, has_penalties

if TYPE_CHECKING:
    from runtime.engine.sequence import Sequence

__all__ = ["needs_processing", "process_logits"]


def _penalized(seq: Sequence) -> bool:
    p = seq.request.sampling
    return has_penalties(p.presence_penalty, p.frequency_penalty, p.repetition_penalty)


def _under_minimum(seq: Sequence) -> bool:
    return len(seq.output_token_ids) < seq.request.sampling.min_tokens


def needs_processing(seq: Sequence) -> bool:
    p = seq.request.sampling
    return p.uses_logits_controls and (_penalized(seq) or bool(p.logit_bias) or _under_minimum(seq))


def _on_rows(logits: torch.Tensor, rows: list[int], apply: Callable[[torch.Tensor], None]) -> None:
    """Run `apply(sub)` on logits[rows] and write the rows back (index_select copies)."""
    index = torch.tensor(rows, device=logits.device)
    sub = logits.index_select(0, index)
    apply(sub)
    logits.index_copy_(0, index, sub)


def process_logits(logits: torch.Tensor, seqs: Seq[Sequence]) -> list[int]:
    """Apply every control in place on logits [N, vocab] (row j is seqs[j]); returns the rows
    that changed (empty: nothing was touched)."""
    changed: set[int] = set()
    rows = [j for j, seq in enumerate(seqs) if _penalized(seq)]
    if rows:
        ps = [seqs[j].request.sampling for j in rows]
        _on_rows(
            logits,
            rows,
            lambda sub: apply_penalties(
                sub,
                [seqs[j].output_token_ids for j in rows],
                [seqs[j].prompt_token_ids for j in rows],
                [p.presence_penalty for p in ps],
                [p.frequency_penalty for p in ps],
                [p.repetition_penalty for p in ps],
            ),
        )
        changed.update(rows)
    rows = [j for j, seq in enumerate(seqs) if seq.request.sampling.logit_bias]
    if rows:
        _on_rows(
            logits,
            rows,
            lambda sub: apply_logit_bias(sub, [seqs[j].request.sampling.logit_bias for j in rows]),
        )
        changed.update(rows)
    rows = [j for j, seq in enumerate(seqs) if _under_minimum(seq)]
    if rows:
        stop_ids = [sorted(seqs[j].stop_checker.stop_token_ids) for j in rows]
        _on_rows(logits, rows, lambda sub: mask_stop_tokens(sub, stop_ids))
        changed.update(rows)
    return sorted(changed)
