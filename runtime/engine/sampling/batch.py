"""The step's sampling batch, built once per step from the rows that sample (as vLLM v1's
`SamplingMetadata`, SGLang's `SamplingBatchInfo`): a tensor where some row needs it and `None`
where none does, the rows that fork (n > 1), the rows that want logprobs, and only the logits
processors some row needs, each owning its rows.

The scheduler counts, as it takes each sequence, the ones with features and the ones that do not
sample greedily (`SchedulerOutput.num_featured` / `num_random`), so:
  - a plain greedy step builds nothing: no pass over the rows at all;
  - a plain step with sampled rows reads only temperature / top-k / top-p, one pass;
  - a step with features makes one pass over the rows, reading each feature slot once.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from runtime.engine.constraints.mask import GrammarMask
from runtime.engine.constraints.state import ConstraintState
from runtime.engine.features import VerifyState
from runtime.engine.sampling.processors import LogitsProcessor, controls_for
from runtime.engine.sampling.rows import Row

__all__ = ["SamplingBatch"]


@dataclass
class SamplingBatch:
    rows: list[Row]  # the step's sampling sequences, then the choices forking from them
    num_own: int  # rows[:num_own] are the step's own; the rest fork (n > 1)
    fork_rows: torch.Tensor | None = None  # [len(rows)] the logits row each samples; None: no fork
    temperatures: torch.Tensor | None = None  # [N]; None: every row is greedy
    greedy_rows: torch.Tensor | None = None  # [N] bool; None: no row is greedy
    top_k: torch.Tensor | None = None  # [N] int, 0 = off; None: no row uses top-k / top-p
    top_p: torch.Tensor | None = None  # [N] float, 1 = off
    generators: list[tuple[int, torch.Generator]] = field(default_factory=list)  # seeded rows
    logprob_rows: list[int] | None = None  # rows whose sampled token's logprob is wanted
    logprob_ks: list[int] = field(default_factory=list)  # alternatives for each of those
    processors: list[LogitsProcessor] = field(default_factory=list)  # in the order they run
    grammar: GrammarMask | None = None  # also the last processor: it advances after the draw
    verified: list[tuple[int, VerifyState]] | None = None  # rows runtime.verify re-checks

    @property
    def is_greedy_only(self) -> bool:
        """Nothing to do but an argmax."""
        return (
            self.temperatures is None
            and not self.processors
            and self.logprob_rows is None
            and self.verified is None
        )

    @classmethod
    def build(
        cls, seqs: Seq[Row], *, featured: bool, all_greedy: bool, device: torch.device | str
    ) -> SamplingBatch:
        """featured / all_greedy: the scheduler's counts for the step (see the module doc)."""
        if not featured:
            batch = cls(rows=list(seqs), num_own=len(seqs))
            if not all_greedy:
                batch._sampling_tensors(device)
            return batch
        rows, sources = _with_forks(seqs)
        batch = cls(rows=rows, num_own=len(seqs))
        if sources is not None:
            batch.fork_rows = torch.tensor(sources, device=device)
        batch._sampling_tensors(device)
        batch._features(device)
        return batch

    def _sampling_tensors(self, device: torch.device | str) -> None:
        """Temperatures, top-k / top-p and the greedy rows: one pass over the params."""
        params = [row.request.sampling for row in self.rows]
        greedy = [p.is_greedy for p in params]
        if all(greedy):
            return
        # greedy rows get temperature 1 here; their draw is discarded
        self.temperatures = torch.tensor([p.temperature or 1.0 for p in params], device=device)
        if any(greedy):
            self.greedy_rows = torch.tensor(greedy, device=device)
        if any(p.uses_top_k_top_p for p in params):
            self.top_k = torch.tensor([p.top_k for p in params], device=device)
            self.top_p = torch.tensor([p.top_p for p in params], device=device)

    def _features(self, device: torch.device | str) -> None:
        """One pass over the rows' feature slots; each feature collects its rows."""
        logprob_rows: list[int] = []
        control_rows: list[int] = []
        constrained: list[tuple[int, ConstraintState, int]] = []
        verified: list[tuple[int, VerifyState]] = []
        for j, row in enumerate(self.rows):
            f = row.features
            if f is None:
                continue
            p = row.request.sampling
            if f.generator is not None:
                self.generators.append((j, f.generator))
            if p.wants_logprobs:
                logprob_rows.append(j)
                self.logprob_ks.append(p.logprobs or 0)
            if p.uses_logits_controls:
                control_rows.append(j)
            if f.constraint is not None:
                constrained.append((j, f.constraint, len(row.output_token_ids)))
            if f.verify is not None:
                verified.append((j, f.verify))
        self.logprob_rows = logprob_rows or None
        self.verified = verified or None
        if control_rows:
            self.processors = controls_for(self.rows, control_rows)
        if constrained:
            self.grammar = GrammarMask(
                rows=[j for j, _, _ in constrained],
                states=[state for _, state, _ in constrained],
                num_outputs=[n for _, _, n in constrained],
                num_rows=len(self.rows),
            )
            self.processors.append(self.grammar)


def _with_forks(seqs: Seq[Row]) -> tuple[list[Row], list[int] | None]:
    """The step's rows followed by the choices forking from them, and (when there are forks) the
    logits row each samples from (a fork samples from its choice 0's row)."""
    rows: list[Row] = list(seqs)
    sources = list(range(len(seqs)))
    for j, seq in enumerate(seqs):
        f = seq.features
        if f is not None and f.choice is not None and f.choice.pending_forks:
            rows.extend(f.choice.pending_forks)
            sources.extend([j] * len(f.choice.pending_forks))
    return rows, (sources if len(rows) > len(seqs) else None)
