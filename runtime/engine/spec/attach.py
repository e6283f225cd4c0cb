"""Speculative decoding for a built engine: the scheduler's speculator (drafts, pages,
rollback) and, for `self_draft`, the runner's drafter (the quantized copy of the weights).
Built here and handed back; the engine's build puts them on its scheduler and runner, so this
package never imports the core.

Built after the batch warm-up: with `max_batch_for_speculation` unset, the batch above which a
step drafts nothing is read off the sweep's plain step times (spec/threshold.py), no new steps."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
    from runtime.engine.spec.drafter import SelfDrafter
    from runtime.memory.kv_cache import KVCache
    from runtime.models.loader import LoadedModel

__all__ = ["Speculation", "build_speculation", "resolve_threshold"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Speculation:
    speculator: Speculator  # the scheduler's
    drafter: SelfDrafter | None  # the runner's; None unless self_draft


def build_speculation(
    config: SpecConfig,
    kv_cache: KVCache,
    loaded: LoadedModel,
    *,
    curve: list[tuple[float, float]],
    max_batch: int = 64,
) -> Speculation:
    """`curve`: the warm-up sweep's (tokens, seconds) plain steps (empty without a sweep);
    `max_batch`: the engine's batch cap, the measured threshold's bound."""
    threshold = resolve_threshold(config, curve, max_batch)
    drafter: SelfDrafter | None = None
    if config.method == "self_draft":
        from runtime.engine.spec.drafter import SelfDrafter

        drafter = SelfDrafter.build(loaded, config, kv_cache)
    speculation = Speculation(Speculator(config, kv_cache, threshold), drafter)
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
    return speculation


def resolve_threshold(
    config: SpecConfig, curve: list[tuple[float, float]], max_batch: int
) -> SpecThreshold:
    """The setting when given; else measured from the warm-up sweep; else the default."""
    if config.max_batch_for_speculation is not None:
        return SpecThreshold(config.max_batch_for_speculation, "setting")
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
