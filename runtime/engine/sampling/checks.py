"""Every check of SamplingParams, in one place (bounds as OpenAI and vLLM give them).

`validate` runs when a SamplingParams is built, so an invalid one never exists; `check_token_ids`
needs the model's vocabulary, so the engine calls it when it validates a request.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from runtime.errors import InvalidRequestError


class SamplingParams(Protocol):
    """The fields of runtime.engine.sampling.params.SamplingParams read here (a protocol: that
    module calls `validate`, so importing it back would close an import cycle)."""

    @property
    def max_tokens(self) -> int: ...
    @property
    def temperature(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def top_p(self) -> float: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def stop(self) -> Sequence[str]: ...
    @property
    def stop_token_ids(self) -> Sequence[int]: ...
    @property
    def n(self) -> int: ...
    @property
    def num_seqs(self) -> int: ...
    @property
    def logprobs(self) -> int | None: ...
    @property
    def prompt_logprobs(self) -> int | None: ...
    @property
    def presence_penalty(self) -> float: ...
    @property
    def frequency_penalty(self) -> float: ...
    @property
    def repetition_penalty(self) -> float: ...
    @property
    def logit_bias(self) -> Sequence[tuple[int, float]]: ...
    @property
    def min_tokens(self) -> int: ...


__all__ = [
    "MAX_BIASED_TOKENS",
    "MAX_CHOICES",
    "MAX_LOGIT_BIAS",
    "MAX_LOGPROBS",
    "MAX_STOP_STRINGS",
    "PENALTY_BOUNDS",
    "check_token_ids",
    "validate",
]

MAX_STOP_STRINGS = 16
MAX_CHOICES = 16  # n and best_of: sequences of one prompt (each counts as one in admission)
MAX_LOGPROBS = 20  # OpenAI's bound on alternatives per position
MAX_LOGIT_BIAS = 100.0
MAX_BIASED_TOKENS = 1024  # a bound on the per-row work a request can ask for
# [low, high] of each penalty (OpenAI's; repetition_penalty vLLM's (0, 2], but a tiny divisor
# would push logits to inf: nan probabilities). The API's schema states these same bounds.
PENALTY_BOUNDS = {
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "repetition_penalty": (0.01, 2.0),
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_range(value: float, lo: float, hi: float, param: str) -> None:
    if not isinstance(value, int | float) or not math.isfinite(value) or not lo <= value <= hi:
        raise InvalidRequestError(f"{param} must be in [{lo:g}, {hi:g}]", param=param)


def _check_logprobs(value: int | None, param: str) -> None:
    if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
        raise InvalidRequestError(f"{param} must be an integer in [0, {MAX_LOGPROBS}]", param=param)


def _check_sampling(p: SamplingParams) -> None:
    if not _is_int(p.max_tokens):
        raise InvalidRequestError("max_tokens must be an integer", param="max_tokens")
    if p.max_tokens < 1:
        raise InvalidRequestError("max_tokens must be at least 1", param="max_tokens")
    if not math.isfinite(p.temperature) or p.temperature < 0:
        raise InvalidRequestError("temperature must be >= 0", param="temperature")
    if not _is_int(p.top_k) or p.top_k < 0:
        raise InvalidRequestError("top_k must be an integer >= 0 (0 = off)", param="top_k")
    if not math.isfinite(p.top_p) or not 0.0 < p.top_p <= 1.0:
        raise InvalidRequestError("top_p must be in (0, 1]", param="top_p")
    if p.seed is not None and not _is_int(p.seed):
        raise InvalidRequestError("seed must be an integer", param="seed")


def _check_choices_and_stops(p: SamplingParams) -> None:
    for name, value in (("n", p.n), ("best_of", p.num_seqs)):
        if not _is_int(value) or not 1 <= value <= MAX_CHOICES:
            raise InvalidRequestError(f"{name} must be in [1, {MAX_CHOICES}]", param=name)
    if p.num_seqs < p.n:
        raise InvalidRequestError("best_of must be >= n", param="best_of")
    if len(p.stop) > MAX_STOP_STRINGS:
        raise InvalidRequestError(f"at most {MAX_STOP_STRINGS} stop strings", param="stop")
    if any(not isinstance(s, str) or not s for s in p.stop):
        raise InvalidRequestError("stop strings must be non-empty strings", param="stop")
    if any(not _is_int(t) or t < 0 for t in p.stop_token_ids):
        raise InvalidRequestError("stop_token_ids must be ids >= 0", param="stop_token_ids")


def _check_logits_controls(p: SamplingParams) -> None:
    _check_logprobs(p.logprobs, "logprobs")
    _check_logprobs(p.prompt_logprobs, "prompt_logprobs")
    for name, (lo, hi) in PENALTY_BOUNDS.items():
        _check_range(getattr(p, name), lo, hi, name)
    if len(p.logit_bias) > MAX_BIASED_TOKENS:
        raise InvalidRequestError(
            f"logit_bias holds at most {MAX_BIASED_TOKENS} tokens", param="logit_bias"
        )
    for token_id, bias in p.logit_bias:
        if not _is_int(token_id) or token_id < 0:
            raise InvalidRequestError("logit_bias keys must be token ids >= 0", param="logit_bias")
        _check_range(bias, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS, "logit_bias")
    if not _is_int(p.min_tokens) or p.min_tokens < 0:
        raise InvalidRequestError("min_tokens must be an integer >= 0", param="min_tokens")
    if p.min_tokens > p.max_tokens:
        raise InvalidRequestError("min_tokens must not exceed max_tokens", param="min_tokens")


def validate(p: SamplingParams) -> None:
    """Raise InvalidRequestError naming the offending parameter (the first one found)."""
    _check_sampling(p)
    _check_choices_and_stops(p)
    _check_logits_controls(p)


def check_token_ids(p: SamplingParams, vocab_size: int) -> None:
    """Token ids a request names must be in the model's vocabulary."""
    if any(token_id >= vocab_size for token_id, _ in p.logit_bias):
        raise InvalidRequestError(
            f"logit_bias token ids must be in [0, {vocab_size})", param="logit_bias"
        )
