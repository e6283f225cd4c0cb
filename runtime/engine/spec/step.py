"""A step with drafting rows (runtime.engine.spec): the model runner's `execute` for it.

One forward over every row's chunk, as any step: prefill chunks, one-token decodes and the
drafting rows' 1 + k tokens side by side. The rows without drafts are sampled as in any step
(their `SamplingBatch`, the `Sampler`); each drafting row's k + 1 positions are turned into logits
and verified (verify.py; a constrained row under its grammar, constrained.py), with the emitted
tokens' logprobs where the row asks (the target's, as the sampler computes them).
The runner writes the drafts of `self_draft` rows in first (the drafter), packs the rows and
runs the forward (its own, so a tensor-parallel runner's workers get the step too), then hands
the hidden states here; the result goes back as a `DraftedStep` the runner turns into its
`StepOutput`. The batch is read through protocols (rows.py), so this module imports neither the
runner nor the scheduler's batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from runtime.engine.sampling.batch import SamplingBatch
from runtime.engine.sampling.sampler import Sampler, SamplerOutput
from runtime.engine.spec.constrained import verify_constrained
from runtime.engine.spec.controls import controlled_logits
from runtime.engine.spec.verify import SpecResult, chosen_logits, emitted_logprobs, verify_row

if TYPE_CHECKING:
    from runtime.engine.spec.rows import SpecBatch, SpecSeq
    from runtime.models.base import CausalLM, SeqSlice

__all__ = ["DraftedStep", "execute_with_drafts"]


@dataclass
class DraftedStep:
    plain_idx: list[int]  # the items sampled as usual (their chunk reached its end, no drafts)
    sampling: SamplingBatch | None  # their sampling batch; None when there were none
    sampled: SamplerOutput | None
    spec: dict[int, SpecResult]  # each drafting item (by index) -> its verification


def execute_with_drafts(
    model: CausalLM,
    sampler: Sampler,
    device: torch.device,
    batch: SpecBatch,
    slices: list[SeqSlice],
    hidden: torch.Tensor,  # [T, H] the packed chunk's forward (the chunked one, never fast)
) -> DraftedStep:
    items = batch.items
    plain = [i for i, item in enumerate(items) if item.samples and not item.draft_token_ids]
    drafting = [i for i, item in enumerate(items) if item.draft_token_ids]
    step = DraftedStep(plain, None, None, {})
    if plain:
        last = torch.tensor([slices[i].end - 1 for i in plain], device=device)
        logits = model.compute_logits(hidden.index_select(0, last))
        seqs = [items[i].seq for i in plain]
        step.sampling = SamplingBatch.build(
            seqs,
            featured=any(seq.features is not None for seq in seqs),
            all_greedy=all(seq.request.sampling.is_greedy for seq in seqs),
            device=device,
        )
        step.sampled = sampler(logits, step.sampling)
    # every drafting row's k + 1 positions: its slice of the packed chunk
    positions = [p for i in drafting for p in range(slices[i].start, slices[i].end)]
    index = torch.tensor(positions, device=device)
    logits = model.compute_logits(hidden.index_select(0, index))  # [sum(k+1), V]
    argmax = logits.argmax(dim=-1).tolist()  # one host copy for the greedy rows
    # controls, logprobs, verification sampling and constraints live in a sequence's features
    # slot: a step whose rows have none (the scheduler's count) looks at none of them
    featured = batch.num_featured > 0
    offset = 0
    for i in drafting:
        seq, drafts = items[i].seq, items[i].draft_token_ids
        assert drafts is not None
        span = len(drafts) + 1
        rows = logits[offset : offset + span]  # the target's own (logprobs, verification)
        step.spec[i] = _verify(seq, drafts, rows, argmax[offset : offset + span], featured)
        offset += span
    return step


def _verify(
    seq: SpecSeq, drafts: list[int], rows: torch.Tensor, argmax: list[int], featured: bool
) -> SpecResult:
    params = seq.request.sampling
    f = seq.features if featured else None
    if f is None:
        return verify_row(rows, drafts, params, seq.generator, argmax)
    judged: torch.Tensor = rows
    target: list[int] | None = argmax
    if params.uses_logits_controls:  # each position's controls, as after the drafts before it
        judged, target = controlled_logits(rows, seq, drafts), None
    if f.constraint is None:
        result = verify_row(judged, drafts, params, seq.generator, target)
    else:  # structured output: each draft judged under the grammar (constrained.py)
        num_outputs = len(seq.output_token_ids)
        result = verify_constrained(
            judged, drafts, params, seq.generator, f.constraint, num_outputs
        )
    if params.wants_logprobs:  # the target's, before any control (as the plain sampler's)
        result.logprobs = emitted_logprobs(rows, result.token_ids, params.logprobs or 0)
    if f.verify is not None:  # runtime.verify: the raw logit of each emitted token
        result.chosen_logits = chosen_logits(rows, result.token_ids)
    return result
