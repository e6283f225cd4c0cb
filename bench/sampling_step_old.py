"""bench.sampling_step's reference: the old sampling stage of an engine step, as on main before
issue 36 (a copy of the old runner's sampling lines, `sample`, `process_logits`, the logprobs and
grammar-mask calls), and the rows both paths read of a sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import xgrammar as xgr

from runtime.engine.constraints import ConstraintState
from runtime.engine.features import SeqFeatures
from runtime.engine.logprobs import token_entries
from runtime.engine.request import TokenLogprob
from runtime.engine.sampling import SamplingParams
from runtime.engine.sampling.bias import apply_logit_bias
from runtime.engine.sampling.draw import apply_top_k_top_p
from runtime.engine.sampling.min_tokens import mask_stop_tokens
from runtime.engine.sampling.penalties import apply_penalties


# --- the rows: what both paths read of a sequence -------------------------------------------------
@dataclass(eq=False)
class RowRequest:
    sampling: SamplingParams


@dataclass(eq=False)
class RowStops:
    stop_token_ids: frozenset[int]


@dataclass(eq=False)
class Row:
    """A sequence as the old path read it (loose fields) and as the new one does (features)."""

    request: RowRequest
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    stop_checker: RowStops
    features: SeqFeatures | None = None  # the new path
    # the old Sequence's feature fields
    generator: torch.Generator | None = None
    is_verified: bool = False
    chosen_logit: float | None = None
    pending_forks: list[Row] = field(default_factory=list)
    fork_token: int | None = None
    constraint: ConstraintState | None = None
    step_logprob: TokenLogprob | None = None
    cumulative_logprob: float = 0.0
    prompt_logprobs: list[TokenLogprob | None] | None = None
    prompt_logprobs_sent: bool = False


# --- the old path (reference; as on main before issue 36) -----------------------------------------
def _old_sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    greedy = logits.argmax(dim=-1)
    if all(p.temperature == 0.0 for p in params):
        return greedy
    device = logits.device
    temps = torch.tensor([p.temperature or 1.0 for p in params], device=device)
    scaled = logits / temps.unsqueeze(-1)
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        top_k = torch.tensor([p.top_k for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device, dtype=logits.dtype)
        scaled = apply_top_k_top_p(scaled, top_k, top_p)
    probs = scaled.softmax(dim=-1)
    noise = torch.empty_like(probs).exponential_()
    for row, generator in enumerate(generators):
        if generator is not None:
            noise[row].exponential_(generator=generator)
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    drawn = (probs / noise).argmax(dim=-1)
    is_greedy = torch.tensor([p.temperature == 0.0 for p in params], device=device)
    return torch.where(is_greedy, greedy, drawn)


def _old_uses_controls(p: SamplingParams) -> bool:
    return (
        p.presence_penalty != 0.0
        or p.frequency_penalty != 0.0
        or p.repetition_penalty != 1.0
        or bool(p.logit_bias)
        or p.min_tokens > 0
    )


def _old_penalized(seq: Row) -> bool:
    p = seq.request.sampling
    return p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or p.repetition_penalty != 1.0


def _old_needs_processing(seq: Row) -> bool:
    p = seq.request.sampling
    under = len(seq.output_token_ids) < p.min_tokens
    return _old_uses_controls(p) and (_old_penalized(seq) or bool(p.logit_bias) or under)


def _on_rows(logits: torch.Tensor, rows: list[int], apply: Callable[[torch.Tensor], None]) -> None:
    index = torch.tensor(rows, device=logits.device)
    sub = logits.index_select(0, index)
    apply(sub)
    logits.index_copy_(0, index, sub)


def _old_process_logits(logits: torch.Tensor, seqs: list[Row]) -> None:
    rows = [j for j, seq in enumerate(seqs) if _old_penalized(seq)]
    if rows:
        ps = [seqs[j].request.sampling for j in rows]
        outs = [seqs[j].output_token_ids for j in rows]
        prompts = [seqs[j].prompt_token_ids for j in rows]
        pres = [p.presence_penalty for p in ps]
        freq = [p.frequency_penalty for p in ps]
        rep = [p.repetition_penalty for p in ps]
        _on_rows(logits, rows, lambda sub: apply_penalties(sub, outs, prompts, pres, freq, rep))
    rows = [j for j, seq in enumerate(seqs) if seq.request.sampling.logit_bias]
    if rows:
        biases = [seqs[j].request.sampling.logit_bias for j in rows]
        _on_rows(logits, rows, lambda sub: apply_logit_bias(sub, biases))
    rows = [
        j for j, s in enumerate(seqs) if len(s.output_token_ids) < s.request.sampling.min_tokens
    ]
    if rows:
        stop_ids = [sorted(seqs[j].stop_checker.stop_token_ids) for j in rows]
        _on_rows(logits, rows, lambda sub: mask_stop_tokens(sub, stop_ids))


def _old_asks(p: SamplingParams) -> bool:
    return p.logprobs is not None or p.cumulative_logprob or p.ranks_choices


def _old_masks(logits: torch.Tensor, seqs: list[Row]) -> None:
    rows = [i for i, seq in enumerate(seqs) if seq.constraint is not None]
    if not rows:
        return
    vocab = logits.shape[-1]
    bitmask = xgr.allocate_token_bitmask(len(seqs), vocab)
    for i in rows:
        state = seqs[i].constraint
        assert state is not None
        state.sync(len(seqs[i].output_token_ids))
        state.fill(bitmask, i)
    bitmask = bitmask.to(logits.device, non_blocking=True)
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab, indices=rows)


def old_step(logits: torch.Tensor, seqs: list[Row]) -> list[int | None]:
    """The old runner from its logits on, and the old core's per-token logprobs hand-over."""
    if any(seq.pending_forks for seq in seqs):
        raise NotImplementedError("the bench's batches have no forks")
    params = [s.request.sampling for s in seqs]
    pending = None
    if any(map(_old_asks, params)):
        rows = [j for j, seq in enumerate(seqs) if _old_asks(seq.request.sampling)]
        index = torch.tensor(rows, device=logits.device)
        logprobs = logits.index_select(0, index).float().log_softmax(dim=-1)
        pending = (rows, logprobs, [seqs[j].request.sampling.logprobs or 0 for j in rows])
    raw: dict[int, torch.Tensor] = {}
    if any(_old_uses_controls(p) for p in params) and any(map(_old_needs_processing, seqs)):
        raw = {j: logits[j].clone() for j, s in enumerate(seqs) if s.is_verified}
        _old_process_logits(logits, seqs)
    _old_masks(logits, seqs)
    token_ids = _old_sample(logits, params, [s.generator for s in seqs])
    if pending is not None:
        rows, logprobs, ks = pending
        chosen = token_ids.index_select(0, torch.tensor(rows, device=token_ids.device))
        for row, entry in zip(rows, token_entries(logprobs, chosen, ks), strict=True):
            seqs[row].step_logprob = entry
            seqs[row].cumulative_logprob += entry.logprob
    tokens = token_ids.tolist()
    for seq, token_id in zip(seqs, tokens, strict=True):
        if seq.constraint is not None:
            seq.constraint.accept(token_id)
    sampled: list[int | None] = [None] * len(seqs)
    for j, token_id in enumerate(tokens):
        sampled[j] = int(token_id)
        if seqs[j].is_verified:
            seqs[j].chosen_logit = float(raw.get(j, logits[j])[token_id])
    for seq in seqs:  # the old core: attach_logprobs on each pushed token
        if seq.step_logprob is not None:
            seq.step_logprob = None
    return sampled
