"""One request's place in its grammar: an XGrammar matcher kept in step with its output tokens.

The runner advances the matcher with each sampled token (mask.py). The sequence's
`output_token_ids` stay the truth: `sync(n)` rolls the matcher back to n accepted tokens when a
step's tokens were dropped after the matcher saw them (a step that failed after sampling). A
preempted sequence keeps its output tokens and recomputes only their KV, so its matcher, which
has accepted exactly those tokens, stays as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

import torch

from runtime.engine.constraints.cache import Compiled
from runtime.engine.constraints.pool import CompileBudgetExceeded
from runtime.engine.constraints.spec import ConstraintSpec

if TYPE_CHECKING:  # XGrammar is imported where it is used: it pulls in transformers (~0.8 s)
    import xgrammar as xgr

__all__ = ["ConstraintState"]


class ConstraintState:
    def __init__(
        self,
        spec: ConstraintSpec,
        future: Future[Compiled],
        cache_hit: bool,
        release: Callable[[], None] = lambda: None,
    ) -> None:
        self.spec = spec
        self.release = release  # the request ended before its compile did (cache.release)
        self.future = future  # done before the sequence is ever scheduled (grammar_wait.py)
        self.cache_hit = cache_hit
        self.matcher: xgr.GrammarMatcher | None = None
        self.num_accepted = 0  # tokens the matcher has accepted
        self.num_rejected = 0  # sampled tokens the matcher refused (a mask not applied: a bug)

    def bind(self) -> None:
        """The compile is done: build the matcher (raises the compile's error, if any)."""
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(self.future.result().grammar)

    def _bound(self) -> xgr.GrammarMatcher:
        """The matcher; a choice forked from its request's first choice (n > 1) was never
        queued on its own, so it binds here, its request's compile being done by then."""
        if self.matcher is None:
            self.bind()
        assert self.matcher is not None
        return self.matcher

    @property
    def compile_seconds(self) -> float | None:
        """The compile this request waited for; None for a cache hit."""
        if self.cache_hit or not self.future.done() or self.future.exception() is not None:
            return None
        return self.future.result().compile_seconds

    @property
    def num_evicted(self) -> int:
        """Cache entries evicted to make room for the grammar this request compiled."""
        if self.cache_hit or not self.future.done() or self.future.exception() is not None:
            return 0
        return self.future.result().num_evicted

    @property
    def compile_timed_out(self) -> bool:
        """Its compile ran past its time or memory budget (its worker was killed)."""
        done = self.future.done() and not self.future.cancelled()
        return done and isinstance(self.future.exception(), CompileBudgetExceeded)

    @property
    def is_complete(self) -> bool:
        """The output so far is a complete sentence of the grammar."""
        return self.matcher is not None and (
            self.matcher.is_completed() or self.matcher.is_terminated()
        )

    def sync(self, num_output_tokens: int) -> None:
        matcher = self._bound()
        extra = self.num_accepted - num_output_tokens
        if extra > 0:
            matcher.rollback(extra)
            self.num_accepted = num_output_tokens

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        matcher = self._bound()
        if not matcher.is_terminated():
            matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        matcher = self._bound()
        if matcher.is_terminated():
            return False
        if matcher.accept_token(token_id):
            self.num_accepted += 1
            return True
        self.num_rejected += 1
        return False
