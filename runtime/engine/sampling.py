"""Sampling parameters and the sampler.

`sample()` works on a whole batch at once: temperature scaling, then top-k, then top-p (the
order transformers applies its logits warpers in), then one draw per row. Rows with
temperature 0 take the argmax. A row with its own `torch.Generator` (a request with a `seed`)
draws only from that generator, so its tokens do not depend on what else is in the batch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from runtime.engine.logits.params import validate_logits_params
from runtime.errors import InvalidRequestError

__all__ = ["SamplingParams", "apply_top_k_top_p", "make_generator", "sample"]

MAX_STOP_STRINGS = 16
MAX_CHOICES = 16  # n and best_of: sequences of one prompt (each counts as one in admission)


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
    # logits processing and logprobs (runtime.engine.logits, runtime.engine.logprobs; checked in
    # runtime.engine.logits.params): the defaults ask for nothing and cost nothing
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

    @functools.cached_property
    def uses_logits_controls(self) -> bool:
        """Any control of runtime.engine.logits asked (cached: the runner reads it every step)."""
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
            or bool(self.logit_bias)
            or self.min_tokens > 0
        )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def num_seqs(self) -> int:
        """Sequences this request runs: best_of, else n."""
        return self.best_of if self.best_of is not None else self.n

    @property
    def ranks_choices(self) -> bool:
        """best_of > n: the sampler keeps each sequence's cumulative logprob to rank them."""
        return self.num_seqs > self.n

    def validate(self) -> None:
        """Raise InvalidRequestError naming the offending parameter."""
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise InvalidRequestError("max_tokens must be an integer", param="max_tokens")
        if self.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be at least 1", param="max_tokens")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequestError("temperature must be >= 0", param="temperature")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError("top_k must be an integer >= 0 (0 = off)", param="top_k")
        if not math.isfinite(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError("top_p must be in (0, 1]", param="top_p")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise InvalidRequestError("seed must be an integer", param="seed")
        for name, value in (("n", self.n), ("best_of", self.num_seqs)):
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 1 <= value <= MAX_CHOICES
            ):
                raise InvalidRequestError(f"{name} must be in [1, {MAX_CHOICES}]", param=name)
        if self.num_seqs < self.n:
            raise InvalidRequestError("best_of must be >= n", param="best_of")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(f"at most {MAX_STOP_STRINGS} stop strings", param="stop")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty strings", param="stop")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise InvalidRequestError("stop_token_ids must be ids >= 0", param="stop_token_ids")
        validate_logits_params(self)


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator | None:
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)  # negative seeds are fine too
    return generator


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Mask (set to -inf) what top-k and then top-p remove. logits [N, V]; top_k [N] int (0 = off);
    top_p [N] float (1 = off). Top-p keeps the smallest set of most likely tokens whose mass
    reaches p (the token that crosses p stays), computed after top-k as transformers does."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [N, V]
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab).unsqueeze(-1)  # [N, 1]
    sorted_logits = sorted_logits.masked_fill(ranks >= k, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly more likely tokens
    drop = (mass_before >= top_p.unsqueeze(-1)) & (ranks > 0)  # never drop the top token
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """logits [N, vocab] float32 -> token ids [N] (int64, same device). No host sync."""
    greedy = logits.argmax(dim=-1)
    if all(p.is_greedy for p in params):
        return greedy
    device = logits.device
    # greedy rows get temperature 1 here; their draw is discarded below
    temps = torch.tensor([p.temperature or 1.0 for p in params], device=device)
    scaled = logits / temps.unsqueeze(-1)
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        top_k = torch.tensor([p.top_k for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device, dtype=logits.dtype)
        scaled = apply_top_k_top_p(scaled, top_k, top_p)
    probs = scaled.softmax(dim=-1)
    # exponential race: argmax(p / E) with E ~ Exp(1) draws from p; each seeded row fills its
    # own noise from its own generator, the rest share the global RNG in one call
    noise = torch.empty_like(probs).exponential_()
    for row, generator in enumerate(generators):
        if generator is not None:
            noise[row].exponential_(generator=generator)
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)  # a 0 draw would turn p = 0 into nan
    drawn = (probs / noise).argmax(dim=-1)
    is_greedy = torch.tensor([p.is_greedy for p in params], device=device)
    return torch.where(is_greedy, greedy, drawn)
