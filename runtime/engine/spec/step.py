"""A step with drafting rows (runtime.engine.spec): the model runner's `execute` for it.

One forward over every row's chunk, as any step: prefill chunks, one-token decodes and the
drafting rows' 1 + k tokens side by side. The rows without drafts are sampled as in any step
(their `SamplingBatch`, the `Sampler`); each drafting row's k + 1 positions are turned into logits
and verified (verify.py). The drafts of `self_draft` rows are written in first (the drafter).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from runtime.engine.sampling.batch import SamplingBatch
from runtime.engine.spec.verify import SpecResult, verify_row

if TYPE_CHECKING:
    from runtime.engine.model_runner import ModelRunner, StepOutput
    from runtime.engine.scheduler import SchedulerOutput

__all__ = ["execute_with_drafts"]


def execute_with_drafts(runner: ModelRunner, batch: SchedulerOutput) -> StepOutput:
    from runtime.engine.model_runner import StepOutput  # the runner imports this module

    items = batch.items
    if runner.drafter is not None:  # self_draft: the placeholders become the draft's tokens
        runner.drafter.draft(items)
    input_ids, slices = runner._pack(items)
    hidden = runner.model(input_ids, slices)  # [T, H]: the chunked forward (never the fast path)
    if batch.num_featured:
        runner._prompt_logprobs(items, slices, hidden)
    plain = [i for i, item in enumerate(items) if item.samples and not item.draft_token_ids]
    drafting = [i for i, item in enumerate(items) if item.draft_token_ids]
    if plain:
        last = torch.tensor([slices[i].end - 1 for i in plain], device=runner.device)
        logits = runner.model.compute_logits(hidden.index_select(0, last))
        seqs = [items[i].seq for i in plain]
        sampling = SamplingBatch.build(
            seqs,
            featured=any(seq.features is not None for seq in seqs),
            all_greedy=all(seq.request.sampling.is_greedy for seq in seqs),
            device=runner.device,
        )
        step = StepOutput.of(len(items), plain, sampling, runner.sampler(logits, sampling))
    else:
        step = StepOutput([None] * len(items))
    # every drafting row's k + 1 positions: its slice of the packed chunk
    positions = [p for i in drafting for p in range(slices[i].start, slices[i].end)]
    index = torch.tensor(positions, device=runner.device)
    logits = runner.model.compute_logits(hidden.index_select(0, index))  # [sum(k+1), V]
    argmax = logits.argmax(dim=-1).tolist()  # one host copy for the greedy rows
    step.spec = {}
    offset = 0
    for i in drafting:
        seq, drafts = items[i].seq, items[i].draft_token_ids
        assert drafts is not None
        span = len(drafts) + 1
        result: SpecResult = verify_row(
            logits[offset : offset + span],
            drafts,
            seq.request.sampling,
            seq.generator,
            argmax[offset : offset + span],
        )
        offset += span
        step.spec[i] = result  # its tokens: token_ids[i] stays None (the postprocess pushes it)
    return step
