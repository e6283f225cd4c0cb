"""A sequence's optional features, each in its own slot, all behind one `Sequence.features`.

A plain request (greedy or sampled, no seed, no logprobs, no logits controls, one choice, no
constraint, not verified) has `features is None`: the scheduler counts such rows as it takes
them, so a step of plain rows builds its sampling batch without looking at any row's features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from runtime.engine.logprobs import LogprobState
from runtime.engine.sampling.draw import make_generator

if TYPE_CHECKING:
    from runtime.engine.choice_group import ChoiceState
    from runtime.engine.constraints.state import ConstraintState
    from runtime.engine.lora.registry import ResidentAdapter
    from runtime.engine.sampling.params import SamplingParams

__all__ = ["SeqFeatures", "VerifyState", "features_for"]


@dataclass(eq=False)
class VerifyState:
    """runtime.verify sampled this request: the runner keeps the logit of each token it samples
    (before the logits processors; the last one is the final step's)."""

    chosen_logit: float | None = None


@dataclass(eq=False)
class SeqFeatures:
    generator: torch.Generator | None = None  # a request with a seed: its own sampling state
    choice: ChoiceState[Any] | None = None  # n / best_of > 1 (runtime.engine.choices)
    constraint: ConstraintState | None = None  # its grammar's matcher (structured output)
    logprobs: LogprobState | None = None  # sampled or prompt logprobs asked
    verify: VerifyState | None = None  # sampled for verification (runtime.verify)
    lora: ResidentAdapter | None = None  # a LoRA adapter's weights (runtime.engine.lora)


def features_for(
    params: SamplingParams,
    index: int,
    device: torch.device | str,
    *,
    constraint: ConstraintState | None,
    verified: bool,
    lora: ResidentAdapter | None = None,
) -> SeqFeatures | None:
    """The features slot of choice `index` of a request: None for a plain one."""
    if params.is_plain and constraint is None and not verified and lora is None:
        return None
    # each choice its own seed stream: seed + index (choice 0 is the plain request's)
    seed = None if params.seed is None else params.seed + index
    logprobs = None
    if params.keeps_logprobs:
        logprobs = LogprobState(top_k=params.logprobs, prompt_k=params.prompt_logprobs)
    return SeqFeatures(
        generator=make_generator(seed, device),
        constraint=constraint,
        logprobs=logprobs,
        verify=VerifyState() if verified else None,
        lora=lora,
    )
