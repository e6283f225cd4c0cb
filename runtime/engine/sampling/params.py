"""A request's sampling parameters, checked once (checks.py) and with its feature flags computed
once: the engine reads the flags every step, never the fields behind them."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from runtime.engine.sampling.checks import validate

__all__ = ["SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16  # completion tokens at most; reaching it finishes with "length"
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # nucleus mass kept; 1.0 = off
    seed: int | None = None  # per-request generator; None = the global RNG
    stop: tuple[str, ...] = ()  # stop strings; the matched text is not emitted
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    n: int = 1  # choices returned; each runs as its own sequence over the prompt's shared pages
    best_of: int | None = None  # sequences run (>= n; None = n); the n most likely are returned
    # logits processing and logprobs (runtime.engine.sampling.processors, runtime.engine.logprobs):
    # the defaults ask for nothing and cost nothing
    logprobs: int | None = None  # top alternatives per sampled token (0: the token's own only)
    prompt_logprobs: int | None = None  # the same for every prompt position (echo)
    cumulative_logprob: bool = False  # sum of sampled tokens' logprobs (best_of ranks by it)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # vLLM's extension: >1 discourages prompt and output tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100])
    min_tokens: int = 0  # eos and stop_token_ids are masked until this many tokens

    def __post_init__(self) -> None:
        self.validate()  # an invalid SamplingParams never exists

    def validate(self) -> None:
        """Raise InvalidRequestError naming the offending parameter."""
        validate(self)

    # --- the request's features, computed once (cached on the frozen instance) -----------------
    @functools.cached_property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @functools.cached_property
    def uses_top_k_top_p(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0

    @functools.cached_property
    def uses_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    @functools.cached_property
    def uses_logits_controls(self) -> bool:
        """Any logits processor asked: penalties, logit_bias or min_tokens."""
        return self.uses_penalties or bool(self.logit_bias) or self.min_tokens > 0

    @functools.cached_property
    def wants_logprobs(self) -> bool:
        """The sampled token's logprob is needed: asked for, or summed to rank best_of > n
        choices (the one way the project computes a sampled token's logprob)."""
        return self.logprobs is not None or self.cumulative_logprob or self.ranks_choices

    @functools.cached_property
    def keeps_logprobs(self) -> bool:
        """Sampled or prompt logprobs: the sequence keeps a logprobs state."""
        return self.wants_logprobs or self.prompt_logprobs is not None

    @functools.cached_property
    def is_plain(self) -> bool:
        """None of the features a sequence keeps state for (logprobs, controls, choices, seed):
        a sequence of these params (and no constraint, no verification) has no features slot."""
        return (
            not self.keeps_logprobs
            and not self.uses_logits_controls
            and self.num_seqs == 1
            and self.seed is None
        )

    @property
    def num_seqs(self) -> int:
        """Sequences this request runs: best_of, else n."""
        return self.best_of if self.best_of is not None else self.n

    @property
    def ranks_choices(self) -> bool:
        """best_of > n: the sampler keeps each sequence's cumulative logprob to rank them."""
        return self.num_seqs > self.n
