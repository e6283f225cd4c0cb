"""The self-draft: the served model's own weights, quantized, drafting k tokens greedily."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.errors import ConfigError

if TYPE_CHECKING:
    from runtime.engine.scheduler import ScheduledSeq
    from runtime.engine.spec.config import SpecConfig
    from runtime.memory.kv_cache import KVCache
    from runtime.models.loader import LoadedModel

__all__ = ["SelfDrafter"]


class SelfDrafter:
    @classmethod
    def build(cls, loaded: LoadedModel, config: SpecConfig, kv_cache: KVCache) -> SelfDrafter:
        raise ConfigError(
            "speculative_method=self_draft is not built yet", param="speculative_method"
        )

    def draft(self, items: list[ScheduledSeq]) -> None:
        raise NotImplementedError
