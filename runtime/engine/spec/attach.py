"""Speculative decoding wired into a built engine: the scheduler's speculator (drafts, pages,
rollback) and, for `self_draft`, the runner's drafter (the quantized copy of the weights)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from runtime.engine.spec.config import SpecConfig
from runtime.engine.spec.planner import Speculator

if TYPE_CHECKING:
    from runtime.engine.core import EngineCore
    from runtime.memory.kv_cache import KVCache

__all__ = ["attach_speculation"]

log = logging.getLogger(__name__)


def attach_speculation(core: EngineCore, config: SpecConfig, kv_cache: KVCache) -> None:
    core.scheduler.speculator = Speculator(config, kv_cache)
    if config.method == "self_draft":
        from runtime.engine.spec.drafter import SelfDrafter

        core.runner.drafter = SelfDrafter.build(core.runner.loaded, config, kv_cache)
    log.info(
        "speculative decoding: %s, k=%d, off above %d sequences a step",
        config.method,
        config.num_speculative_tokens,
        config.max_batch_for_speculation,
    )
