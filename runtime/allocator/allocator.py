"""The tiered allocator: one per device, thread-safe, every live byte attributed to an owner.

Accounting: `bytes_in_use` counts a block from alloc until its own storage dies (base, views
and raw aliases all gone), because only then can its memory be handed out again. Release is a
separate, earlier event (all handles released); normally both happen inside `release()`.
Storage death is signalled by a weakref callback that only appends to `_dead` (atomic, safe in
any thread or inside the GC); the queue is drained under the lock by the next allocator call.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from runtime.allocator.block import Block, BlockView, _Record
from runtime.allocator.config import LARGE, MEDIUM, SMALL, AllocatorConfig
from runtime.allocator.report import LeakEvent, LiveBlock, leak_event, live_blocks
from runtime.allocator.tiers import (
    MediumCache,
    SmallSlabs,
    TierCounters,
    return_to_os,
    storage_from_ptr,
)
from runtime.errors import DoubleReleaseError, ForeignBlockError, UseAfterReleaseError
from runtime.stats import AllocatorStats

log = logging.getLogger(__name__)
_UINT8 = torch.uint8


class Allocator:
    def __init__(
        self, config: AllocatorConfig | None = None, device: torch.device | str = "cpu"
    ) -> None:
        self.config = config = config or AllocatorConfig()
        self.device = torch.device(device)
        self._lock = threading.Lock()
        self._small = SmallSlabs(config, self.device)
        self._medium = MediumCache(config.medium_cache_bytes)
        self._counters = {t: TierCounters(t) for t in (SMALL, MEDIUM, LARGE)}
        self._counters[SMALL].bytes_cached = self._small.total_bytes
        self._live: dict[int, _Record] = {}  # serial -> record, until the storage dies
        self._dead: deque[_Record] = deque()  # storages died, not yet accounted
        self._recent_leaks: deque[LeakEvent] = deque(maxlen=256)
        self._serial = 0
        # hot-path constants
        self._small_max, self._medium_max = config.small_max_bytes, config.medium_max_bytes
        self._shift = config.min_block_shift
        self._c_small, self._c_medium, self._c_large = self._counters.values()
        self._templates: dict[torch.dtype, torch.Tensor] = {}

    # --- alloc -------------------------------------------------------------------------------
    def alloc(self, shape: Sequence[int] | int, dtype: torch.dtype, *, owner: str) -> Block:
        """A block of `shape` and `dtype`; its tensor has its own storage (see block.py).

        All of it runs under the lock, so at every moment the lock is free `bytes_in_use` equals
        the sum over live records (building one tensor holds the GIL anyway)."""
        if type(shape) is not tuple:
            shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = math.prod(shape) * dtype.itemsize
        keep: torch.Tensor | None = None  # pool memory the tensor aliases; None = direct
        backing: Any = None  # what goes back to the tier when the storage dies
        home: list[int] | None = None  # the small free list a slab slot returns to
        with self._lock:
            if self._dead:
                self._drain_locked()
            if nbytes < self._small_max:
                tier, c = SMALL, self._c_small
                index = (nbytes - 1).bit_length() - self._shift
                index = index if index > 0 else 0
                free = self._small.free[index]
                if free:  # hit: a slab slot
                    backing, home = free.pop(), free
                    reserved = self._small.class_bytes[index]
                    keep = self._small.slabs[index]
                else:  # miss: class exhausted, a direct allocation freed (not pooled) on release
                    reserved = nbytes
            elif nbytes <= self._medium_max:
                tier, c = MEDIUM, self._c_medium
                reserved = self.config.medium_class_bytes(nbytes)
                backing = keep = self._medium.take(reserved)
            else:  # large: always a direct allocation
                tier, c, reserved = LARGE, self._c_large, nbytes
            is_hit = keep is not None
            try:
                if tier is MEDIUM and not is_hit:  # a new backing, cached when its block dies
                    backing = keep = torch.empty(reserved, dtype=_UINT8, device=self.device)
                if keep is None:
                    tensor = torch.empty(shape, dtype=dtype, device=self.device)
                    storage: Any = tensor.untyped_storage()
                else:
                    ptr = backing if home is not None else keep.data_ptr()
                    storage = storage_from_ptr(ptr, self.device, reserved)
                    storage._fastllm_keep = keep  # pool memory lives as long as any alias of it
                    # contiguous strides are implied when none are given
                    try:
                        template = self._templates[dtype]
                    except KeyError:
                        template = self._template(dtype)
                    tensor = template.new().set_(storage, 0, shape)  # type: ignore[call-overload]
            except BaseException:  # put a taken slot / cached backing back untouched
                if home is not None:
                    home.append(backing)
                elif is_hit:
                    c.evictions += self._medium.put(reserved, backing)
                raise
            if not is_hit:
                c.misses += 1
            elif home is not None:
                c.hits += 1
                c.bytes_cached -= reserved
            else:
                c.hits += 1
                c.bytes_cached = self._medium.cached_bytes
            c.bytes_in_use += reserved
            c.live_blocks += 1
            self._serial = serial = self._serial + 1
            rec = _Record(storage, self._dead.append)  # fires once base, views, aliases all died
            rec.serial, rec.tier, rec.owner = serial, tier, owner
            rec.nbytes, rec.reserved, rec.backing, rec.home = nbytes, reserved, backing, home
            rec.shape, rec.dtype, rec.born_s = shape, dtype, time.monotonic()
            rec.num_handles, rec.is_released = 1, False
            self._live[serial] = rec
        return Block(self, rec, tensor)

    def _template(self, dtype: torch.dtype) -> torch.Tensor:
        """An empty tensor of `dtype` on the device; `.new()` on it is the cheapest constructor."""
        t = self._templates.get(dtype)
        if t is None:
            t = self._templates[dtype] = torch.empty(0, dtype=dtype, device=self.device)
        return t

    # --- views and release -----------------------------------------------------------------------
    def _make_view(self, block: Block, fn: Callable[[torch.Tensor], torch.Tensor]) -> BlockView:
        base = block.tensor  # raises UseAfterReleaseError
        view = fn(base)
        if view.untyped_storage() is not base.untyped_storage():
            raise ValueError("derive(fn): fn must return a view of the block, not a new tensor")
        with self._lock:
            if block._tensor is None:  # released by another thread meanwhile
                raise UseAfterReleaseError(f"block of {block.owner!r} used after release")
            block._rec.num_handles += 1
        return BlockView(block, view)

    def release(self, handle: Block | BlockView) -> None:
        """Release a block's base or one of its views; each handle exactly once."""
        if getattr(handle, "_alloc", None) is not self:
            raise ForeignBlockError(f"{handle!r} was not allocated by this allocator")
        with self._lock:
            tensor = handle._tensor
            if tensor is None:
                raise DoubleReleaseError(f"{handle!r} released twice")
            handle._tensor = None
            rec = handle._rec
            rec.num_handles -= 1
            if rec.num_handles == 0:
                rec.is_released = True
                self._counters[rec.tier].releases += 1
            del tensor  # with no alias left the storage dies here and its record is queued
            give_large_back = self._drain_locked() if self._dead else False
        if give_large_back:
            return_to_os(self.device)

    # --- storage death -------------------------------------------------------------------------
    def _drain_locked(self) -> bool:
        """Account every queued dead storage; True when a large block's memory should go back."""
        large_died = False
        dead = self._dead
        while dead:
            rec = dead.popleft()
            del self._live[rec.serial]
            c = self._counters[rec.tier]
            c.bytes_in_use -= rec.reserved
            c.live_blocks -= 1
            if not rec.is_released:
                c.leaks += 1
                event = leak_event(rec)
                self._recent_leaks.append(event)
                log.warning("allocator leak reclaimed: %s", event)
            backing, rec.backing = rec.backing, None
            if backing is None:
                large_died |= rec.tier is LARGE
            elif rec.home is not None:  # a small slab slot (the hot path, inlined)
                rec.home.append(backing)
                c.bytes_cached += rec.reserved
            else:
                self._give_back(c, rec.reserved, backing, None)
        return large_died and self.config.return_large_to_os

    def _give_back(
        self, c: TierCounters, reserved: int, backing: Any, home: list[int] | None
    ) -> None:
        if home is not None:  # a small slab slot
            home.append(backing)
            c.bytes_cached += reserved
        else:  # a medium backing
            c.evictions += self._medium.put(reserved, backing)
            c.bytes_cached = self._medium.cached_bytes

    def collect(self) -> None:
        """Account storages that died outside a release (dropped views, aliases, leaks)."""
        with self._lock:
            give_large_back = self._drain_locked() if self._dead else False
        if give_large_back:
            return_to_os(self.device)

    # --- reports ---------------------------------------------------------------------------------
    def stats(self) -> AllocatorStats:
        self.collect()
        with self._lock:
            tiers = tuple(c.snapshot() for c in self._counters.values())
        return AllocatorStats(device=str(self.device), tiers=tiers)

    def leak_report(self) -> list[LiveBlock]:
        """Every block whose memory is not back in its tier, oldest first, with its owner."""
        self.collect()
        with self._lock:
            records = list(self._live.values())
        return live_blocks(records)

    def recent_leaks(self) -> list[LeakEvent]:
        """Blocks reclaimed by the finaliser while still unreleased (the last 256)."""
        self.collect()
        with self._lock:
            return list(self._recent_leaks)
