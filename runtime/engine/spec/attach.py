"""Speculative decoding for a built engine: the scheduler's speculator (drafts, pages,
rollback) and, for `self_draft`, the runner's drafter (the quantized copy of the weights).
Built here and handed back; the engine's build puts them on its scheduler and runner, so this
package never imports the core."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtime.engine.spec.config import SpecConfig
from runtime.engine.spec.planner import Speculator

if TYPE_CHECKING:
    from runtime.engine.spec.drafter import SelfDrafter
    from runtime.memory.kv_cache import KVCache
    from runtime.models.loader import LoadedModel

__all__ = ["Speculation", "build_speculation"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Speculation:
    speculator: Speculator  # the scheduler's
    drafter: SelfDrafter | None  # the runner's; None unless self_draft


def build_speculation(config: SpecConfig, kv_cache: KVCache, loaded: LoadedModel) -> Speculation:
    drafter: SelfDrafter | None = None
    if config.method == "self_draft":
        from runtime.engine.spec.drafter import SelfDrafter

        drafter = SelfDrafter.build(loaded, config, kv_cache)
    speculation = Speculation(Speculator(config, kv_cache), drafter)
    log.info(
        "speculative decoding: %s, k=%d, off above %d sequences a step",
        config.method,
        config.num_speculative_tokens,
        config.max_batch_for_speculation,
    )
    return speculation
