"""The logits controls (penalties, logit_bias, min_tokens) as one call over a list of rows: the
engine's step builds them as processors of its sampling batch (runtime.engine.sampling.processors);
this is the same processors run on any rows, for callers and tests outside a step."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import torch

from runtime.engine.sampling.processors import controls_for

if TYPE_CHECKING:
    from runtime.engine.sampling.rows import Row

__all__ = ["process_logits"]


def process_logits(logits: torch.Tensor, seqs: Seq[Row]) -> list[int]:
    """Apply every control in place on logits [N, vocab] (row j is seqs[j]); returns the rows
    that changed (empty: nothing was touched)."""
    rows = [j for j, seq in enumerate(seqs) if seq.request.sampling.uses_logits_controls]
    changed: set[int] = set()
    for processor in controls_for(seqs, rows):
        processor.apply(logits)
        changed.update(processor.rows)
    return sorted(changed)
