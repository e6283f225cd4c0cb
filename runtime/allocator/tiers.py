"""Where tier memory lives: small slabs with free lists, the medium LRU cache, and handing large
memory back. All methods here run under the allocator's lock (they are not thread-safe alone).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections import OrderedDict, deque
from collections.abc import Callable

import torch

from runtime.allocator.config import AllocatorConfig
from runtime.stats import TierStats

# A storage over existing memory that does not own it: each handed-out pooled block gets one of
# these (a distinct StorageImpl), so a weakref on it tracks exactly the block's base + aliases.
# The allocator pins the pool memory to it (`storage._fastllm_keep`), so pool memory can never be
# freed under a live alias, even if the allocator itself is dropped first.
storage_from_ptr = torch._C._construct_storage_from_data_pointer


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


class SmallSlabs:
    """One preallocated slab per power-of-two class, cut into `small_blocks_per_class` slots."""

    def __init__(self, config: AllocatorConfig, device: torch.device) -> None:
        self.class_bytes = [config.small_class_bytes(i) for i in range(config.num_small_classes)]
        n = config.small_blocks_per_class
        self.slabs = [
            torch.empty(n * b, dtype=torch.uint8, device=device) for b in self.class_bytes
        ]
        # free slot addresses per class; LIFO so a hot slot is reused while still in cache
        self.free: list[list[int]] = [
            [slab.data_ptr() + i * b for i in reversed(range(n))]
            for slab, b in zip(self.slabs, self.class_bytes, strict=True)
        ]

    @property
    def total_bytes(self) -> int:
        return sum(s.numel() for s in self.slabs)


class MediumCache:
    """Freed medium backings by class; one LRU order across classes, evicted above the cap."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self.cached_bytes = 0
        self._by_class: dict[int, deque[torch.Tensor]] = {}
        self._lru: OrderedDict[int, tuple[int, torch.Tensor]] = OrderedDict()  # id -> (class, t)

    def take(self, class_bytes: int) -> torch.Tensor | None:
        q = self._by_class.get(class_bytes)
        if not q:
            return None
        backing = q.pop()  # most recently returned of this class
        del self._lru[id(backing)]
        self.cached_bytes -= class_bytes
        return backing

    def put(self, class_bytes: int, backing: torch.Tensor) -> int:
        """Cache a backing whose aliases are all dead; returns how many backings were evicted."""
        self._by_class.setdefault(class_bytes, deque()).append(backing)
        self._lru[id(backing)] = (class_bytes, backing)
        self.cached_bytes += class_bytes
        evicted = 0
        while self.cached_bytes > self.cap_bytes:
            _, (cls, oldest) = self._lru.popitem(last=False)
            # per-class queues are in return order too, so the global oldest heads its queue
            assert self._by_class[cls][0] is oldest
            self._by_class[cls].popleft()
            self.cached_bytes -= cls
            evicted += 1
        return evicted


def _find_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        fn = getattr(ctypes.CDLL(name), "malloc_trim", None)
    except OSError:
        return None
    return fn  # type: ignore[no-any-return]


_malloc_trim = _find_malloc_trim()


def return_to_os(device: torch.device) -> None:
    """Hand freed large memory back: a dead tensor's memory sits in PyTorch's caching allocator
    (CUDA) or glibc's free lists (CPU, chunks below the dynamic mmap threshold) otherwise."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "cpu" and _malloc_trim is not None:
        _malloc_trim(0)
