"""Checks of the logits-processing and logprobs fields of SamplingParams (bounds as OpenAI and
vLLM give them); `check_token_ids` needs the vocabulary, so the engine calls it at validation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from runtime.errors import InvalidRequestError

__all__ = [
    "MAX_LOGIT_BIAS",
    "MAX_LOGPROBS",
    "PENALTY_BOUNDS",
    "check_token_ids",
    "validate_logits_params",
]

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


class LogitsFields(Protocol):
    """The fields of SamplingParams checked here (a protocol: sampling.py imports this module)."""

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
    @property
    def max_tokens(self) -> int: ...


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_logprobs(value: int | None, param: str) -> None:
    if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
        raise InvalidRequestError(f"{param} must be an integer in [0, {MAX_LOGPROBS}]", param=param)


def _check_range(value: float, lo: float, hi: float, param: str) -> None:
    if not isinstance(value, int | float) or not math.isfinite(value) or not lo <= value <= hi:
        raise InvalidRequestError(f"{param} must be in [{lo:g}, {hi:g}]", param=param)


def validate_logits_params(p: LogitsFields) -> None:
    """Raise InvalidRequestError naming the offending field."""
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


def check_token_ids(p: LogitsFields, vocab_size: int) -> None:
    """Token ids a request names must be in the model's vocabulary."""
    if any(token_id >= vocab_size for token_id, _ in p.logit_bias):
        raise InvalidRequestError(
            f"logit_bias token ids must be in [0, {vocab_size})", param="logit_bias"
        )
