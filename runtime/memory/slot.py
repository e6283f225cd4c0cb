"""The per-slot record the allocator keeps, and the per-tier counters every slot updates.

Shared by block.py (handles), tiers.py (pools), report.py (leak reports) and allocator.py; it
imports none of them, so the package has no import cycle.
"""

from __future__ import annotations

from typing import Any

import torch

from runtime.memory.stats import TierStats


class TierCounters:
    __slots__ = (
        "bytes_cached",
        "bytes_in_use",
        "evictions",
        "hits",
        "leaks",
        "live_blocks",
        "misses",
        "name",
        "releases",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.bytes_in_use = self.bytes_cached = self.live_blocks = 0
        self.hits = self.misses = self.evictions = self.releases = self.leaks = 0

    def snapshot(self) -> TierStats:
        return TierStats(
            tier=self.name,
            bytes_in_use=self.bytes_in_use,
            bytes_cached=self.bytes_cached,
            hits=self.hits,
            misses=self.misses,
            evictions=self.evictions,
            releases=self.releases,
            leaks=self.leaks,
            live_blocks=self.live_blocks,
        )


class Slot:
    """One piece of tier memory and, while handed out, the bookkeeping of its block.

    Pooled slots (a small slab slot, a medium backing) live as long as the allocator keeps the
    memory; a direct slot (large tier, small-tier miss) serves one block and is then dropped.
    """

    # M = the memory, fixed for the slot's life; T = the persistent tensor, rebuilt only when a
    # handout wants another shape/dtype (or the last owner changed it in place); H = the handout
    __slots__ = (
        "born_s",  # H: time.monotonic() at alloc
        "cdata",  # T: C pointer of `storage`, for the use-count probe
        "counters",  # M: the tier's TierCounters
        "dtype",  # T
        "home",  # M: small free list this slot returns to; None for medium and direct slots
        "is_direct",  # M: not pooled: the memory is dropped when the block is reclaimed
        "is_leaked",  # H: a handle was dropped unreleased
        "keep",  # M: what a storage over pool memory must pin (the small slab), else None
        "lru_stamp",  # M: when a cached medium slot came back (MediumCache's LRU order)
        "mq",  # M: the MediumCache list of a medium slot's class; None for small and direct
        "nbytes",  # H: bytes of the requested tensor
        "num_handles",  # H: base + views neither released nor dropped
        "owner",  # H
        "ptr",  # M: address of the memory
        "ref",  # T: a private twin of `tensor` (same storage, sizes, strides) to detect mutation
        "reserved",  # M: bytes taken from the tier (class size); what bytes_in_use counts
        "s_refs",  # T: Python refcount of `storage` when nothing but the slot holds it
        "s_uses",  # T: C++ use count of the storage when only `tensor`, `ref`, `storage` do
        "shape",  # T
        "storage",  # T: the slot's own storage (a distinct StorageImpl) over the memory
        "tensor",  # T: the tensor handed out as Block.tensor
        "tier",  # M
    )
    counters: TierCounters
    home: list[Slot] | None
    is_direct: bool
    keep: torch.Tensor | None
    lru_stamp: int
    mq: list[Slot] | None
    ptr: int
    reserved: int
    tier: str
    cdata: int
    dtype: torch.dtype | None
    ref: torch.Tensor | None
    s_refs: int
    s_uses: int
    shape: tuple[int, ...] | None
    storage: Any
    tensor: torch.Tensor | None
    born_s: float
    is_leaked: bool
    nbytes: int
    num_handles: int
    owner: str

    def __init__(
        self, counters: TierCounters, reserved: int, home: list[Slot] | None, is_direct: bool
    ) -> None:
        self.counters, self.tier, self.reserved = counters, counters.name, reserved
        self.home, self.is_direct, self.keep, self.ptr = home, is_direct, None, 0
        self.mq = None
        self.storage = self.tensor = self.ref = self.shape = self.dtype = None
        self.cdata = self.s_refs = self.s_uses = self.lru_stamp = 0
        self.owner, self.born_s, self.nbytes, self.num_handles = "", 0.0, 0, 0
        self.is_leaked = False
