"""The target's verdict on each drafting row: the emitted tokens of one verification.

A drafting row fed `[t, d_1 .. d_n]` (its pending token, then n drafts), so its n + 1 logits rows
are the target's distributions for the positions of d_1 .. d_n and the one after them.
  - greedy: the drafts are accepted while each equals the target's argmax there; the first
    mismatch is replaced by the argmax, and when all n match the argmax after them is added
    (the bonus token). The emitted tokens are exactly what n + 1 plain greedy steps would emit.
  - sampled: rejection sampling (Leviathan et al. 2023, Chen et al. 2023) with a point-mass
    draft (n-gram and greedy self-drafts are deterministic): d_j is accepted with probability
    p_j(d_j), where p_j is the target's distribution after temperature / top-k / top-p; at the
    first rejection a token is drawn from p_j with d_j removed (renormalised max(p_j - q, 0)),
    and when all are accepted the bonus is drawn from p_{n+1}. Each emitted token is then
    distributed exactly as the target's own draw would be.
A row with a seed draws only from its own generator (its tokens do not depend on the batch).
A row that asks for logprobs gets, for each emitted token, the entry the plain sampler would give
it: log-softmax of the target's own logits at that position (`emitted_logprobs`).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from runtime.engine.logprobs import token_entries
from runtime.engine.request import TokenLogprob
from runtime.engine.sampling.draw import apply_top_k_top_p
from runtime.engine.sampling.params import SamplingParams

__all__ = [
    "SpecResult",
    "chosen_logits",
    "draw_without",
    "emitted_logprobs",
    "target_probs",
    "verify_row",
]


@dataclass
class SpecResult:
    token_ids: list[int]  # emitted: the accepted drafts, then the target's own next token
    num_drafted: int
    num_accepted: int
    # one per emitted token, from the target's logits (requests with logprobs); None: not asked
    logprobs: list[TokenLogprob] | None = None
    # one per emitted token: the target's raw logit of it (requests runtime.verify samples)
    chosen_logits: list[float] | None = None


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target's sampling distribution at each position: logits [P, V] -> probs [P, V]."""
    scaled = logits.float() / params.temperature
    if params.uses_top_k_top_p:
        rows = scaled.shape[0]
        top_k = torch.full((rows,), params.top_k, device=scaled.device)
        top_p = torch.full((rows,), params.top_p, device=scaled.device)
        scaled = apply_top_k_top_p(scaled, top_k, top_p)
    return scaled.softmax(dim=-1)


def verify_row(
    logits: torch.Tensor,  # [n + 1, V] the row's logits at the drafted positions and after
    drafts: Seq[int],
    params: SamplingParams,
    generator: torch.Generator | None,
    argmax: list[int] | None = None,  # the rows' argmax when the caller took it for all at once
) -> SpecResult:
    n = len(drafts)
    if params.is_greedy:
        target = argmax if argmax is not None else logits.argmax(dim=-1).tolist()
        m = 0
        while m < n and target[m] == drafts[m]:
            m += 1
        return SpecResult([*drafts[:m], target[m]], n, m)
    probs = target_probs(logits, params)  # [n + 1, V]
    uniforms = torch.rand(n, generator=generator, device=probs.device).tolist()
    index = torch.tensor(list(drafts), device=probs.device)
    chosen = probs[:n].gather(1, index.unsqueeze(1)).squeeze(1).tolist()  # p_j(d_j)
    m = 0
    while m < n and uniforms[m] < chosen[m]:
        m += 1
    if m < n:  # rejected at m
        token = draw_without(probs[m], drafts[m], generator)
    else:
        token = int(torch.multinomial(probs[n], 1, generator=generator))
    return SpecResult([*drafts[:m], token], n, m)


def draw_without(probs: torch.Tensor, draft: int, generator: torch.Generator | None) -> int:
    """The token after a rejected draft: drawn from the position's distribution without it."""
    residual = probs.clone()
    residual[draft] = 0.0
    if float(residual.sum()) <= 0.0:  # p(d) == 1 cannot be rejected; float guard
        residual = probs
    return int(torch.multinomial(residual, 1, generator=generator))


def emitted_logprobs(
    logits: torch.Tensor,  # [n + 1, V] the row's logits, as verify_row got them
    token_ids: Seq[int],  # the emitted tokens: token j was chosen at position j
    k: int,  # alternatives asked (SamplingParams.logprobs or 0)
) -> list[TokenLogprob]:
    """Each emitted token's entry exactly as the plain sampler computes it (runtime.engine
    .logprobs): the log-softmax of the target's fp32 logits before temperature / top-k / top-p,
    at the position the token was chosen at, never the draft's."""
    m = len(token_ids)
    logprobs = logits[:m].float().log_softmax(dim=-1)
    chosen = torch.tensor(list(token_ids), device=logits.device)
    return token_entries(logprobs, chosen, [k] * m)


def chosen_logits(logits: torch.Tensor, token_ids: Seq[int]) -> list[float]:
    """Each emitted token's logit at its position, before any control or mask: what the plain
    sampler keeps for runtime.verify (its final token's is re-checked on the reference path)."""
    m = len(token_ids)
    index = torch.tensor(list(token_ids), device=logits.device).unsqueeze(1)
    return [float(v) for v in logits[:m].float().gather(1, index).squeeze(1).tolist()]
