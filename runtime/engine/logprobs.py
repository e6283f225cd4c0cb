"""Log-probabilities of sampled and prompt tokens, for the rows that ask only.

Values are the model's own distribution: log-softmax of the fp32 logits before temperature,
penalties, logit_bias and top-k/p (vLLM's default). The runner calls `sampled_logprobs` before it
processes the logits (`select_rows` copies the rows that ask, so the controls may then change the
batch in place) and `finish` after sampling; `prompt_logprobs` turns the hidden states of a
prefill chunk into the logprobs of the prompt tokens they predict. A step where no row asks does
no softmax and no [N, vocab] work.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from runtime.engine.request import TokenLogprob, TokenOutput

if TYPE_CHECKING:
    from runtime.engine.sampling import SamplingParams
    from runtime.engine.sequence import Sequence

__all__ = [
    "PROMPT_ROWS_PER_PASS",
    "PendingLogprobs",
    "TokenLogprob",
    "asks_sampled_logprobs",
    "attach_logprobs",
    "prompt_logprobs",
    "sampled_logprobs",
    "wants_logprobs",
]

# prompt positions turned into logits at once: bounds the [rows, vocab] fp32 temporary of a long
# prompt (512 × 49152 × 4 B ≈ 100 MB for SmolLM2's vocabulary)
PROMPT_ROWS_PER_PASS = 512


def asks_sampled_logprobs(p: SamplingParams) -> bool:
    """The sampled token's logprob is needed: asked for, or summed to rank best_of > n choices
    (the one way the project computes a sampled token's logprob)."""
    return p.logprobs is not None or p.cumulative_logprob or p.ranks_choices


def wants_logprobs(seq: Sequence) -> bool:
    return asks_sampled_logprobs(seq.request.sampling)


def _entries(logprobs: torch.Tensor, chosen: torch.Tensor, ks: Seq[int]) -> list[TokenLogprob]:
    """logprobs [n, vocab] (log-softmax), chosen [n] ids, ks: alternatives per row. One host
    copy per quantity; the per-row Python is kept small (prompt logprobs build one per token)."""
    picked = logprobs.gather(1, chosen.unsqueeze(1))  # [n, 1]
    ranks = (logprobs > picked).sum(dim=1).add_(1).tolist()
    ids, values = chosen.tolist(), picked.squeeze(1).tolist()
    k = max(ks, default=0)
    if k == 0:
        return [TokenLogprob(t, v, r) for t, v, r in zip(ids, values, ranks, strict=True)]
    top_values, top_ids = logprobs.topk(k, dim=1)
    tops = [
        tuple(zip(row_ids[:kj], row_values[:kj], strict=True))
        for row_ids, row_values, kj in zip(top_ids.tolist(), top_values.tolist(), ks, strict=True)
    ]
    return [
        TokenLogprob(t, v, r, top) for t, v, r, top in zip(ids, values, ranks, tops, strict=True)
    ]


@dataclass
class PendingLogprobs:
    """The log-softmax of the rows that asked, taken before the logits were processed."""

    rows: list[int]  # indices into the step's sampled rows
    logprobs: torch.Tensor  # [len(rows), vocab]
    ks: list[int]

    def finish(self, token_ids: torch.Tensor, seqs: Seq[Sequence]) -> None:
        """Give each asking sequence the logprob of the token it sampled this step."""
        chosen = token_ids.index_select(0, torch.tensor(self.rows, device=token_ids.device))
        for row, entry in zip(self.rows, _entries(self.logprobs, chosen, self.ks), strict=True):
            seq = seqs[row]
            seq.step_logprob = entry
            seq.cumulative_logprob += entry.logprob


def sampled_logprobs(logits: torch.Tensor, seqs: Seq[Sequence]) -> PendingLogprobs | None:
    rows = [j for j, seq in enumerate(seqs) if wants_logprobs(seq)]
    if not rows:
        return None
    index = torch.tensor(rows, device=logits.device)
    logprobs = logits.index_select(0, index).float().log_softmax(dim=-1)
    ks = [seqs[j].request.sampling.logprobs or 0 for j in rows]
    return PendingLogprobs(rows, logprobs, ks)


def prompt_logprobs(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,  # [n, H]: the rows of prompt positions p whose next token is known
    targets: Seq[int],  # prompt[p + 1] for each row
    k: int,
) -> list[TokenLogprob]:
    out: list[TokenLogprob] = []
    for start in range(0, len(targets), PROMPT_ROWS_PER_PASS):
        end = min(start + PROMPT_ROWS_PER_PASS, len(targets))
        logprobs = compute_logits(hidden[start:end]).float().log_softmax(dim=-1)
        chosen = torch.tensor(targets[start:end], device=hidden.device)
        out.extend(_entries(logprobs, chosen, [k] * (end - start)))
    return out


def attach_logprobs(seq: Sequence, output: TokenOutput) -> None:
    """Move what the runner computed for `seq` this step onto its output: the sampled token's
    logprob, the cumulative sum, and (once, with the first token) the prompt's logprobs."""
    params = seq.request.sampling
    if seq.step_logprob is not None:
        if params.logprobs is not None:
            output.logprobs = [seq.step_logprob]
        seq.step_logprob = None
        output.cumulative_logprob = seq.cumulative_logprob
    if seq.prompt_logprobs is not None and not seq.prompt_logprobs_sent:
        output.prompt_logprobs = list(seq.prompt_logprobs)
        seq.prompt_logprobs_sent = True
