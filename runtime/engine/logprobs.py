"""Log-probabilities of sampled and prompt tokens, for the rows that ask only.

Values are the model's own distribution: log-softmax of the fp32 logits before temperature,
penalties, logit_bias and top-k/p (vLLM's default). The sampler (runtime.engine.sampling) takes
the log-softmax of the rows that ask before any processor changes the logits and turns it into
`TokenLogprob`s once the tokens are drawn; they travel in its output to the core, which gives
them to the request's `LogprobState`. `prompt_logprobs` turns the hidden states of a prefill
chunk into the logprobs of the prompt tokens they predict. A step where no row asks does no
softmax and no [N, vocab] work.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from runtime.engine.request import TokenLogprob, TokenOutput

__all__ = [
    "PROMPT_ROWS_PER_PASS",
    "LogprobState",
    "TokenLogprob",
    "prompt_logprobs",
    "token_entries",
]

# prompt positions turned into logits at once: bounds the [rows, vocab] fp32 temporary of a long
# prompt (512 × 49152 × 4 B ≈ 100 MB for SmolLM2's vocabulary)
PROMPT_ROWS_PER_PASS = 512


def token_entries(
    logprobs: torch.Tensor,  # [n, vocab] log-softmax
    chosen: torch.Tensor,  # [n] token ids
    ks: Seq[int],  # alternatives per row
) -> list[TokenLogprob]:
    """One host copy per quantity; the per-row Python is kept small (prompt logprobs build one
    per token)."""
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
        out.extend(token_entries(logprobs, chosen, [k] * (end - start)))
    return out


@dataclass(eq=False)
class LogprobState:
    """A sequence's logprobs feature: what spans steps (the running sum, the prompt's list)."""

    top_k: int | None  # SamplingParams.logprobs: None = the entries are not returned
    prompt_k: int | None  # SamplingParams.prompt_logprobs: None = not asked
    cumulative: float = 0.0  # of the sampled tokens (logprobs, or best_of > n ranks by it)
    prompt: list[TokenLogprob | None] | None = None  # None for position 0
    prompt_sent: bool = False

    @property
    def needs_prompt_logits(self) -> bool:
        """Prompt logprobs asked and not yet sent: every prompt position must be computed."""
        return self.prompt_k is not None and not self.prompt_sent

    def add_prompt_chunk(
        self,
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
        hidden: torch.Tensor,  # [chunk, H]: this chunk's positions, starting at `start`
        prompt: list[int],
        start: int,
    ) -> None:
        """Logprobs of the prompt tokens this chunk's positions predict (position p predicts
        prompt[p + 1]; the last prompt position predicts the first sampled token instead)."""
        if self.prompt is None:
            self.prompt = [None] * len(prompt)
        end = min(start + hidden.shape[0], len(prompt) - 1)
        if end <= start:
            return
        entries = prompt_logprobs(
            compute_logits, hidden[: end - start], prompt[start + 1 : end + 1], self.prompt_k or 0
        )
        self.prompt[start + 1 : end + 1] = entries

    def annotate(self, output: TokenOutput, entry: TokenLogprob | None) -> None:
        """Fill `output` (one sampled token) from this step's entry: the token's logprob when
        asked, the running sum, and (once, with the first token) the prompt's logprobs."""
        if entry is not None:
            self.cumulative += entry.logprob
            if self.top_k is not None:
                output.logprobs = [entry]
            output.cumulative_logprob = self.cumulative
        if self.prompt is not None and not self.prompt_sent:
            output.prompt_logprobs = list(self.prompt)
            self.prompt_sent = True
