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


@dataclass(frozen=True)
class KVCacheStats:
    """One engine's page pool (runtime.memory.kv_cache). Page counts are a snapshot; the token and
    preemption counts are cumulative since the engine started."""

    page_size: int = 0  # tokens per page
    num_pages: int = 0  # pages sequences can hold (the pool's one zero page excluded)
    num_used_pages: int = 0  # held by at least one sequence
    num_cached_pages: int = 0  # held by none, kept for prefix reuse (evicted first, LRU)
    num_free_pages: int = 0
    num_shared_pages: int = 0  # of the used ones, held by several sequences (prefix, n choices)
    prefix_query_tokens: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hit_tokens: int = 0  # of those, found cached (not recomputed)
    num_preemptions: int = 0  # sequences preempted for lack of pages (recomputed later)
    pool_id: str = ""  # which pool (replicas of one version each have their own)

    @property
    def usage_ratio(self) -> float:
        return self.num_used_pages / self.num_pages if self.num_pages else 0.0

    @classmethod
    def total(cls, parts: list[KVCacheStats]) -> KVCacheStats:
        """Several pools (replicas) as one: every count summed."""
        return cls(
            page_size=parts[0].page_size if parts else 0,
            num_pages=sum(p.num_pages for p in parts),
            num_used_pages=sum(p.num_used_pages for p in parts),
            num_cached_pages=sum(p.num_cached_pages for p in parts),
            num_free_pages=sum(p.num_free_pages for p in parts),
            num_shared_pages=sum(p.num_shared_pages for p in parts),
            prefix_query_tokens=sum(p.prefix_query_tokens for p in parts),
            prefix_hit_tokens=sum(p.prefix_hit_tokens for p in parts),
            num_preemptions=sum(p.num_preemptions for p in parts),
            pool_id="+".join(p.pool_id for p in parts),
        )
