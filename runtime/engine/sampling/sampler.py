"""The sampler: logits [N, vocab] and the step's SamplingBatch in, token ids (and logprobs, only
when a row asked) out. Logprobs are the model's own distribution, so they are taken before any
processor changes the logits; the verified rows' logits are kept as they were for the same
reason. A greedy-only batch is one argmax and one host copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.engine.logprobs import token_entries
from runtime.engine.request import TokenLogprob
from runtime.engine.sampling.batch import SamplingBatch
from runtime.engine.sampling.draw import draw

__all__ = ["Sampler", "SamplerOutput"]


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row of the batch (its own rows, then its forks)
    logprobs: list[TokenLogprob | None] | None = None  # per row; None: no row asked


class Sampler:
    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """logits [num_own, vocab] float32: one row per own row of the batch."""
        if batch.fork_rows is not None:  # n choices: one prefill, a row for each choice
            logits = logits.index_select(0, batch.fork_rows)
        if batch.is_greedy_only:
            return SamplerOutput(logits.argmax(dim=-1).tolist())
        logprobs = None
        if batch.logprob_rows is not None:
            logprobs = _rows(logits, batch.logprob_rows).float().log_softmax(dim=-1)
        raw = None  # the verified rows' logits before the processors (copied only if any run)
        if batch.verified is not None and batch.processors:
            raw = _rows(logits, [row for row, _ in batch.verified])
        for processor in batch.processors:
            processor.apply(logits)
        token_ids = self._draw(logits, batch)
        tokens = token_ids.tolist()
        if batch.grammar is not None:  # each constrained row's matcher takes its token
            batch.grammar.accept(tokens)
        for k, (row, state) in enumerate(batch.verified or ()):  # runtime.verify checks it
            source = logits[row] if raw is None else raw[k]
            state.chosen_logit = float(source[tokens[row]])
        out = SamplerOutput(tokens)
        if logprobs is not None and batch.logprob_rows is not None:
            chosen = _rows(token_ids, batch.logprob_rows)
            entries = token_entries(logprobs, chosen, batch.logprob_ks)
            out.logprobs = [None] * len(tokens)
            for row, entry in zip(batch.logprob_rows, entries, strict=True):
                out.logprobs[row] = entry
        return out

    @staticmethod
    def _draw(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        if batch.temperatures is None:
            return logits.argmax(dim=-1)
        return draw(
            logits,
            batch.temperatures,
            batch.top_k,
            batch.top_p,
            batch.generators,
            batch.greedy_rows,
        )


def _rows(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
    return t.index_select(0, torch.tensor(rows, device=t.device))
