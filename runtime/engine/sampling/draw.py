"""Drawing tokens from a batch of logits: temperature, then top-k, then top-p (the order
transformers applies its logits warpers in), then one draw per row. Greedy rows take the argmax.
A row with its own `torch.Generator` (a request with a `seed`) draws only from that generator,
so its tokens do not depend on what else is in the batch.

`sample(logits, params, generators)` is the per-call form (tests, tools); the engine's step goes
through `Sampler` (sampler.py) with the tensors a `SamplingBatch` built once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from runtime.engine.sampling.params import SamplingParams

__all__ = ["apply_top_k_top_p", "draw", "make_generator", "sample"]


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


def draw(
    logits: torch.Tensor,  # [N, vocab] float32
    temperatures: torch.Tensor,  # [N]: greedy rows hold 1 (their draw is discarded)
    top_k: torch.Tensor | None,  # [N] int, 0 = off; None: no row uses top-k / top-p
    top_p: torch.Tensor | None,  # [N] float, 1 = off
    generators: Sequence[tuple[int, torch.Generator]],  # (row, its generator): seeded rows
    greedy_rows: torch.Tensor | None,  # [N] bool; None: no row is greedy
) -> torch.Tensor:
    """Token ids [N] (int64, same device). No host sync."""
    scaled = logits / temperatures.unsqueeze(-1)
    if top_k is not None and top_p is not None:
        scaled = apply_top_k_top_p(scaled, top_k, top_p)
    probs = scaled.softmax(dim=-1)
    # exponential race: argmax(p / E) with E ~ Exp(1) draws from p; each seeded row fills its
    # own noise from its own generator, the rest share the global RNG in one call
    noise = torch.empty_like(probs).exponential_()
    for row, generator in generators:
        noise[row].exponential_(generator=generator)
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)  # a 0 draw would turn p = 0 into nan
    drawn = (probs / noise).argmax(dim=-1)
    if greedy_rows is None:
        return drawn
    return torch.where(greedy_rows, logits.argmax(dim=-1), drawn)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """logits [N, vocab] float32 -> token ids [N] (int64, same device). No host sync."""
    if all(p.is_greedy for p in params):
        return logits.argmax(dim=-1)
    device = logits.device
    temps = torch.tensor([p.temperature or 1.0 for p in params], device=device)
    top_k = top_p = None
    if any(p.uses_top_k_top_p for p in params):
        top_k = torch.tensor([p.top_k for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device, dtype=logits.dtype)
    seeded = [(row, g) for row, g in enumerate(generators) if g is not None]
    greedy = torch.tensor([p.is_greedy for p in params], device=device)
    return draw(logits, temps, top_k, top_p, seeded, greedy)
