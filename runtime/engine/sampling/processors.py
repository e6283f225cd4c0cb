"""Logits processors, each owning the rows that need it; built by the sampling batch only when
some row asks. They run in vLLM's order (penalties, then logit_bias, then the min_tokens mask,
so a masked stop token stays masked), then the grammar mask (runtime.engine.constraints.mask),
so no penalty or bias can lift a forbidden token back. Each changes the logits in place.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from runtime.engine.sampling.bias import apply_logit_bias
from runtime.engine.sampling.min_tokens import mask_stop_tokens
from runtime.engine.sampling.penalties import apply_penalties

if TYPE_CHECKING:
    from runtime.engine.sampling.rows import Row

__all__ = ["LogitBias", "LogitsProcessor", "MinTokens", "Penalties", "controls_for"]


class LogitsProcessor(Protocol):
    rows: list[int]  # the rows of the step's logits it changes

    def apply(self, logits: torch.Tensor) -> None: ...


def _on_rows(logits: torch.Tensor, rows: list[int], apply: Callable[[torch.Tensor], None]) -> None:
    """Run `apply(sub)` on logits[rows] and write the rows back (index_select copies)."""
    index = torch.tensor(rows, device=logits.device)
    sub = logits.index_select(0, index)
    apply(sub)
    logits.index_copy_(0, index, sub)


@dataclass
class Penalties:
    rows: list[int]
    outputs: list[list[int]]
    prompts: list[list[int]]
    presence: list[float]
    frequency: list[float]
    repetition: list[float]

    @classmethod
    def of(cls, rows: list[int], seqs: Seq[Row]) -> Penalties:
        ps = [seqs[j].request.sampling for j in rows]
        return cls(
            rows,
            [seqs[j].output_token_ids for j in rows],
            [seqs[j].prompt_token_ids for j in rows],
            [p.presence_penalty for p in ps],
            [p.frequency_penalty for p in ps],
            [p.repetition_penalty for p in ps],
        )

    def apply(self, logits: torch.Tensor) -> None:
        _on_rows(
            logits,
            self.rows,
            lambda sub: apply_penalties(
                sub, self.outputs, self.prompts, self.presence, self.frequency, self.repetition
            ),
        )


@dataclass
class LogitBias:
    rows: list[int]
    biases: list[tuple[tuple[int, float], ...]]

    def apply(self, logits: torch.Tensor) -> None:
        _on_rows(logits, self.rows, lambda sub: apply_logit_bias(sub, self.biases))


@dataclass
class MinTokens:
    rows: list[int]  # rows still under their min_tokens
    stop_ids: list[list[int]]  # the tokens that would stop each

    def apply(self, logits: torch.Tensor) -> None:
        _on_rows(logits, self.rows, lambda sub: mask_stop_tokens(sub, self.stop_ids))


def controls_for(seqs: Seq[Row], rows: Seq[int]) -> list[LogitsProcessor]:
    """The processors of the logits controls (penalties, logit_bias, min_tokens) for `rows`, the
    rows of `seqs` whose params use one: only those some row needs, in the order they run."""
    penalized: list[int] = []
    biased: list[int] = []
    under_min: list[int] = []
    for j in rows:
        seq = seqs[j]
        p = seq.request.sampling
        if p.uses_penalties:
            penalized.append(j)
        if p.logit_bias:
            biased.append(j)
        if len(seq.output_token_ids) < p.min_tokens:
            under_min.append(j)
    out: list[LogitsProcessor] = []
    if penalized:
        out.append(Penalties.of(penalized, seqs))
    if biased:
        out.append(LogitBias(biased, [seqs[j].request.sampling.logit_bias for j in biased]))
    if under_min:
        stops = [sorted(seqs[j].stop_checker.stop_token_ids) for j in under_min]
        out.append(MinTokens(under_min, stops))
    return out
