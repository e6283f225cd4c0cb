"""The logits controls (penalties, logit_bias, min_tokens) on a drafting row's positions.

A plain step applies a row's controls to its one logits row, with the row's output so far: the
penalties count its output tokens, min_tokens masks the stop tokens while it has fewer outputs
than asked. Position j of a drafting row (the distribution after d_1 .. d_j) is judged only when
d_1 .. d_j were all accepted, i.e. emitted, so its controls are the plain step's as if they had
been: the row's output extended by those drafts. Each position is one pseudo-row (`_Ahead`) and
the plain step's processors (sampling/processors.py) run over them, in the same order, on a copy
of the logits (the caller keeps the target's own for logprobs and verification). Only rows whose
params use a control come here; the others never build anything.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from collections.abc import Set
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from runtime.engine.sampling.processors import controls_for

if TYPE_CHECKING:
    from runtime.engine.features import SeqFeatures
    from runtime.engine.sampling.params import SamplingParams
    from runtime.engine.sampling.rows import Row

__all__ = ["control_rows", "controlled_logits"]


@dataclass(frozen=True)
class _Request:
    sampling: SamplingParams


@dataclass(frozen=True)
class _Stops:
    stop_token_ids: Set[int]


@dataclass(frozen=True)
class _Ahead:
    """The row as the plain step would see it once the drafts before this position are out."""

    request: _Request
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    stop_checker: _Stops
    features: SeqFeatures | None


def controlled_logits(
    logits: torch.Tensor,  # [n + 1, V] the row's logits at the drafted positions and after
    seq: Row,
    drafts: Seq[int],
) -> torch.Tensor:
    """A copy of `logits` with position j's controls applied as after emitting drafts[:j]."""
    ahead = [_ahead(seq, drafts[:j]) for j in range(len(drafts) + 1)]
    out = logits.float().clone()
    for processor in controls_for(ahead, range(len(ahead))):
        processor.apply(out)
    return out


def control_rows(logits: torch.Tensor, seqs: Seq[Row], drafted: Seq[Seq[int]]) -> None:
    """In place on logits [N, V] (row i is seqs[i]'s next position after drafted[i]): the
    controls of the rows that use any (the self-draft's, so its drafts follow them too)."""
    rows = [i for i, seq in enumerate(seqs) if seq.request.sampling.uses_logits_controls]
    if rows:
        ahead = [_ahead(seq, done) for seq, done in zip(seqs, drafted, strict=True)]
        for processor in controls_for(ahead, rows):
            processor.apply(logits)


def _ahead(seq: Row, drafts: Seq[int]) -> _Ahead:
    return _Ahead(
        _Request(seq.request.sampling),
        seq.prompt_token_ids,
        [*seq.output_token_ids, *drafts],
        _Stops(seq.stop_checker.stop_token_ids),
        seq.features,
    )
