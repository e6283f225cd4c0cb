"""Verification of a constrained row's drafts (structured output): the grammar checks each one.

A plain step masks the row's logits with what its matcher allows next, draws, and advances the
matcher with the token (constraints/mask.py). Verified drafts must leave the same trace, so the
row's positions are walked in order: position j's logits are masked with the matcher's state
after d_1 .. d_j-1, the draft d_j is judged against that masked distribution (greedy: it must
be the masked argmax; sampled: accepted with probability p_j(d_j), zero for a token the grammar
forbids), and the matcher takes each accepted draft and then the target's own token. A draft
the grammar forbids is therefore rejected, never emitted, and the matcher never sees a rejected
draft, so nothing has to be rolled back in it. The walk stops after a draft that ends the
grammar (its stop token): the plain path would end the request there too.

Logprobs, when asked, are the target's before the mask (as the plain sampler's): the caller
takes them from the unmasked logits.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from runtime.engine.constraints.state import ConstraintState
from runtime.engine.sampling.params import SamplingParams
from runtime.engine.spec.verify import SpecResult, draw_without, target_probs

__all__ = ["verify_constrained"]


def verify_constrained(
    logits: torch.Tensor,  # [n + 1, V] the row's logits at the drafted positions and after
    drafts: Seq[int],
    params: SamplingParams,
    generator: torch.Generator | None,
    state: ConstraintState,
    num_outputs: int,  # the row's output tokens: what its matcher must have accepted
) -> SpecResult:
    import xgrammar as xgr  # here, not at import (constraints/spec.py says why)

    state.sync(num_outputs)  # a step dropped after its matcher advanced (see state.py)
    vocab = logits.shape[-1]
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    emitted: list[int] = []
    num_accepted = 0
    for j in range(len(drafts) + 1):
        row = logits[j : j + 1].clone()  # the caller keeps the unmasked logits (logprobs)
        xgr.reset_token_bitmask(bitmask)
        state.fill(bitmask, 0)
        xgr.apply_token_bitmask_inplace(row, bitmask.to(row.device), vocab_size=vocab)
        draft = drafts[j] if j < len(drafts) else None
        token = _judge(row, draft, params, generator)
        state.accept(token)
        emitted.append(token)
        if token != draft:
            break  # the target's own token ends the row's emission
        num_accepted += 1
        if state.matcher is not None and state.matcher.is_terminated():
            break  # the draft ended the grammar: the plain path would end the request here
    return SpecResult(emitted, len(drafts), num_accepted)


def _judge(
    row: torch.Tensor,  # [1, V] masked logits
    draft: int | None,  # None: the position after the last draft (the bonus token)
    params: SamplingParams,
    generator: torch.Generator | None,
) -> int:
    """The token emitted at this position: the draft when accepted, else the target's."""
    if params.is_greedy:
        return int(row[0].argmax())
    probs = target_probs(row, params)[0]
    if draft is None:
        return int(torch.multinomial(probs, 1, generator=generator))
    uniform = float(torch.rand(1, generator=generator, device=probs.device))
    if uniform < float(probs[draft]):
        return draft
    return draw_without(probs, draft, generator)
