"""Numbers the allocator emits (the engine forwards them to its sinks in `runtime.engine.stats`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TierStats:
    """One allocator tier (small / medium / large)."""

    tier: str
    bytes_in_use: int = 0
    bytes_cached: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    releases: int = 0
    leaks: int = 0
    live_blocks: int = 0


@dataclass(frozen=True)
class AllocatorStats:
    device: str
    tiers: tuple[TierStats, ...] = ()

    @property
    def bytes_in_use(self) -> int:
        return sum(t.bytes_in_use for t in self.tiers)

    @property
    def bytes_cached(self) -> int:
        return sum(t.bytes_cached for t in self.tiers)

    @property
    def live_blocks(self) -> int:
        return sum(t.live_blocks for t in self.tiers)
