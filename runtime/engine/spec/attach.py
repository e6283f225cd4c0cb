"""Speculative decoding wired into a built engine: the scheduler's speculator (drafts, pages,
rollback) and, for `self_draft`, the runner's drafter (the quantized copy of the weights).

Called after the batch warm-up: with `max_batch_for_speculation` unset, the batch above which a
step drafts nothing is read off the sweep's plain step times (spec/threshold.py), no new steps."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from runtime.engine.batching.step_model import StepTimeModel
from runtime.engine.spec.config import SpecConfig
from runtime.engine.spec.planner import Speculator
from runtime.engine.spec.threshold import (
    DEFAULT_MAX_BATCH,
    DRAFT_STEP_SHARE,
    EXPECTED_ACCEPTANCE,
    SpecThreshold,
    choose_max_batch,
)

if TYPE_CHECKING:
    from runtime.engine.core import EngineCore
    from runtime.memory.kv_cache import KVCache

__all__ = ["attach_speculation", "resolve_threshold"]

log = logging.getLogger(__name__)


def attach_speculation(
    core: EngineCore, config: SpecConfig, kv_cache: KVCache, *, max_batch: int = 64
) -> Speculator:
    """`max_batch`: the engine's batch cap, the measured threshold's bound."""
    threshold = resolve_threshold(core, config, max_batch)
    speculator = Speculator(config, kv_cache, threshold)
    core.scheduler.speculator = speculator
    if config.method == "self_draft":
        from runtime.engine.spec.drafter import SelfDrafter

        core.runner.drafter = SelfDrafter.build(core.runner.loaded, config, kv_cache)
    if threshold.source == "measured":
        how = f"measured at warm-up, expected gain {threshold.gain_at_1:.2f}x at batch 1"
    elif threshold.source == "setting":
        how = "max_batch_for_speculation"
    else:
        how = "default: no warm-up step times"
    log.info(
        "speculative decoding: %s, k=%d, off above %d sequences a step (%s)",
        config.method,
        config.num_speculative_tokens,
        threshold.max_batch,
        how,
    )
    return speculator


def resolve_threshold(core: EngineCore, config: SpecConfig, max_batch: int) -> SpecThreshold:
    """The setting when given; else measured from the warm-up sweep; else the default."""
    if config.max_batch_for_speculation is not None:
        return SpecThreshold(config.max_batch_for_speculation, "setting")
    curve = warmup_curve(core)
    if len({tokens for tokens, _ in curve}) < 2:
        return SpecThreshold(DEFAULT_MAX_BATCH, "default")
    share = DRAFT_STEP_SHARE[config.draft_quant] if config.method == "self_draft" else 0.0
    return choose_max_batch(
        curve,
        config.num_speculative_tokens,
        EXPECTED_ACCEPTANCE[config.method],
        max_batch,
        draft_share=share,
    )


def warmup_curve(core: EngineCore) -> list[tuple[float, float]]:
    """(tokens, seconds) of the warm-up sweep's plain steps (one knot per batch size, each a mean
    of its steps: one-token rows, so tokens = rows); empty without a sweep."""
    model = getattr(core.controller.source, "model", None)
    if not isinstance(model, StepTimeModel):
        return []
    fit = model.fit()
    if fit is None:
        return []
    return [(knot.features[0], knot.seconds) for knot in fit.reference if knot.seconds > 0]
