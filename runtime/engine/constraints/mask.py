"""The grammar mask, a logits processor of the sampling batch (runtime.engine.sampling): built
only when some row of the step has a constraint, it owns those rows' matchers. `apply` sets the
tokens each constrained row's grammar forbids next to -inf (one batched kernel call); `accept`
advances each matcher with the token its row sampled. Unconstrained rows are untouched.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from runtime.engine.constraints.state import ConstraintState

__all__ = ["GrammarMask"]


@dataclass
class GrammarMask:
    rows: list[int]  # the constrained rows of the step's logits
    states: list[ConstraintState]  # their matchers, in the same order
    num_outputs: list[int]  # their output lengths: a matcher rolls back past a dropped step
    num_rows: int  # rows in the step's logits

    def apply(self, logits: torch.Tensor) -> None:
        """logits [N, vocab], in place."""
        import xgrammar as xgr  # here, not at import: see spec.py

        vocab = logits.shape[-1]
        bitmask = xgr.allocate_token_bitmask(self.num_rows, vocab)  # [N, ceil(vocab/32)] int32
        for row, state, num_outputs in zip(self.rows, self.states, self.num_outputs, strict=True):
            state.sync(num_outputs)
            state.fill(bitmask, row)
        bitmask = bitmask.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab, indices=self.rows)

    def accept(self, token_ids: Seq[int]) -> None:
        """token_ids: the step's sampled tokens, one per row of the logits."""
        for row, state in zip(self.rows, self.states, strict=True):
            state.accept(token_ids[row])
