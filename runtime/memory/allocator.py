"""The tiered allocator: one per device, thread-safe, every live byte attributed to an owner.

Accounting: `bytes_in_use` counts a block from alloc until its slot is reclaimed, i.e. until its
handles are all released (or dropped) *and* no alias of its memory is left, because only then
can the memory be handed out again. Release is a separate, earlier event; normally both happen
inside `release()`. A slot whose block was released while an alias lives waits on `_pending`
and is probed again on the next miss of any tier, on `collect()`, `stats()` and the reports.
Handles dropped unreleased are queued on `_dropped` by their `__del__` (an atomic append, safe in
any thread or inside the GC) and counted as leaks when the queue is drained under the lock.

Every counter and the `_live` set change together under `_lock`, so at every moment the lock is
free `bytes_in_use` equals the sum over `_live`. The hot paths (a small or medium hit and its
release) take the lock once each and reuse the slot's persistent tensor (see block.py).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence

import torch

from runtime.errors import DoubleReleaseError, ForeignBlockError, UseAfterReleaseError
from runtime.memory.block import Block, BlockView
from runtime.memory.config import AllocatorConfig
from runtime.memory.ledger import AllocatorLedger
from runtime.memory.slot import Slot, TierCounters
from runtime.memory.tiers import (
    fit,
    is_quiet,
    new_direct,
    new_medium,
    return_to_os,
)

_monotonic = time.monotonic
_getrefcount = sys.getrefcount
_storage_use_count = torch._C._storage_Use_Count


class Allocator(AllocatorLedger):
    """Handing out and taking back (the hot paths); the books it keeps are ledger.py's."""

    def __init__(
        self, config: AllocatorConfig | None = None, device: torch.device | str = "cpu"
    ) -> None:
        super().__init__(config, device)
        config = self.config
        # hot-path constants
        self._small_max, self._medium_max = config.small_max_bytes, config.medium_max_bytes
        self._shift = config.min_block_shift
        self._free = self._small.free
        self._by_nbytes = self._medium.by_nbytes

    # --- alloc -------------------------------------------------------------------------------
    def alloc(self, shape: Sequence[int] | int, dtype: torch.dtype, *, owner: str) -> Block:
        """A block of `shape` and `dtype` (contiguous, uninitialised), tagged with `owner`."""
        if type(shape) is not tuple:
            shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = math.prod(shape) * dtype.itemsize
        born = _monotonic()
        if nbytes < self._small_max:
            index = (nbytes - 1).bit_length() - self._shift
            free = self._free[index if index > 0 else 0]
            lock = self._lock
            lock.acquire()
            try:
                if free:  # hit: a slab slot
                    slot = free.pop()
                    if slot.shape != shape or slot.dtype is not dtype:
                        try:
                            fit(slot, shape, dtype, self.device)
                        except BaseException:
                            free.append(slot)
                            raise
                    c = self._c_small
                    c.hits += 1
                    c.bytes_cached -= slot.reserved
                    c.bytes_in_use += slot.reserved
                    c.live_blocks += 1
                    self._live.add(slot)
                    slot.owner, slot.born_s, slot.nbytes = owner, born, nbytes
                    slot.num_handles, slot.is_leaked = 1, False
                    return Block(self, slot, slot.tensor, owner)  # type: ignore[arg-type]
            finally:
                lock.release()
            return self._small_miss(free, shape, dtype, nbytes, owner, born)
        if nbytes <= self._medium_max:
            lock, medium = self._lock, self._medium
            lock.acquire()
            try:
                q = self._by_nbytes.get(nbytes)  # the class's list of cached backings
                if q is None:  # a size not seen yet (or past the memo's bound)
                    q = medium.queue_for(nbytes)
                if q:  # hit: the latest cached backing of the class (MediumCache.take inlined)
                    slot = q.pop()
                    reserved = slot.reserved
                    medium.cached_bytes -= reserved
                    if slot.shape != shape or slot.dtype is not dtype:
                        try:
                            fit(slot, shape, dtype, self.device)
                        except BaseException:
                            self._c_medium.evictions += medium.put(slot)
                            raise
                    c = self._c_medium
                    c.hits += 1
                    c.bytes_cached = medium.cached_bytes
                    c.bytes_in_use += reserved
                    c.live_blocks += 1
                    self._live.add(slot)
                    slot.owner, slot.born_s, slot.nbytes = owner, born, nbytes
                    slot.num_handles, slot.is_leaked = 1, False
                    return Block(self, slot, slot.tensor, owner)  # type: ignore[arg-type]
            finally:
                lock.release()
            return self._medium_miss(shape, dtype, nbytes, q, owner, born)
        return self._alloc_direct(self._c_large, shape, dtype, nbytes, owner, born)

    def _small_miss(
        self,
        free: list[Slot],
        shape: tuple[int, ...],
        dtype: torch.dtype,
        nbytes: int,
        owner: str,
        born: float,
    ) -> Block:
        """The class is exhausted: reclaim what became quiet, else allocate directly (freed, not
        pooled, on release)."""
        if self._pending or self._dropped:
            self.collect()
            with self._lock:
                if free:
                    slot = free.pop()
                    if slot.shape != shape or slot.dtype is not dtype:
                        try:
                            fit(slot, shape, dtype, self.device)
                        except BaseException:
                            free.append(slot)
                            raise
                    self._c_small.hits += 1
                    self._c_small.bytes_cached -= slot.reserved
                    return self._hand_out(self._c_small, slot, owner, born, nbytes)
        return self._alloc_direct(self._c_small, shape, dtype, nbytes, owner, born)

    def _medium_miss(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        nbytes: int,
        q: list[Slot],
        owner: str,
        born: float,
    ) -> Block:
        """No cached backing in `q`, the class's list: reclaim what became quiet, else fresh
        memory (cached when its block is released)."""
        lock, medium = self._lock, self._medium
        reserved = self.config.medium_class_bytes(nbytes)
        if self._pending or self._dropped:
            self.collect()  # a miss: maybe a pending slot of this class is quiet by now
            with lock:
                slot = medium.take(reserved)
                if slot is not None:
                    return self._medium_hit(slot, shape, dtype, nbytes, owner, born)
        c = self._c_medium
        slot = new_medium(c, reserved, q, self.device)
        fit(slot, shape, dtype, self.device)
        with lock:
            c.misses += 1
            return self._hand_out(c, slot, owner, born, nbytes)

    def _medium_hit(
        self,
        slot: Slot,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        nbytes: int,
        owner: str,
        born: float,
    ) -> Block:
        c = self._c_medium
        if slot.shape != shape or slot.dtype is not dtype:
            try:
                fit(slot, shape, dtype, self.device)
            except BaseException:
                c.evictions += self._medium.put(slot)
                raise
        c.hits += 1
        c.bytes_cached = self._medium.cached_bytes
        return self._hand_out(c, slot, owner, born, nbytes)

    def _alloc_direct(
        self,
        c: TierCounters,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        nbytes: int,
        owner: str,
        born: float,
    ) -> Block:
        if c is self._c_large and (self._pending or self._dropped):
            self.collect()  # large memory held only by the pending list goes back first
        slot = new_direct(c, shape, dtype, self.device)
        with self._lock:
            c.misses += 1
            return self._hand_out(c, slot, owner, born, nbytes)

    def _hand_out(self, c: TierCounters, slot: Slot, owner: str, born: float, nbytes: int) -> Block:
        """Under the lock: account a slot as live and wrap it in a Block."""
        c.bytes_in_use += slot.reserved
        c.live_blocks += 1
        self._live.add(slot)
        slot.owner, slot.born_s, slot.nbytes = owner, born, nbytes
        slot.num_handles, slot.is_leaked = 1, False
        return Block(self, slot, slot.tensor, owner)  # type: ignore[arg-type]

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
        try:
            mine = handle._alloc is self
        except AttributeError:  # not a handle at all
            mine = False
        if not mine:
            raise ForeignBlockError(f"{handle!r} was not allocated by this allocator")
        slot = handle._rec
        give_large_back = False
        lock = self._lock
        lock.acquire()
        try:
            if handle._tensor is None:
                raise DoubleReleaseError(f"{handle!r} released twice")
            handle._tensor = None  # no other reference to the tensor is left in this frame
            slot.num_handles -= 1
            if slot.num_handles:
                return  # views (or the base) still out
            if self._breakdowns:
                self._breakdowns.pop(slot, None)
            c = slot.counters
            if not slot.is_leaked:  # else a dropped view already made it a leak
                c.releases += 1
            t, ref, storage = slot.tensor, slot.ref, slot.storage
            if slot.is_leaked or ref is None or t is None:  # a dropped view; direct; unfitted
                del t, ref, storage
                if is_quiet(slot):
                    give_large_back = self._reclaim(slot)
                else:
                    self._pending.append(slot)
            # tiers.is_quiet inlined for a fitted pooled slot (keep the two in step); the locals
            # t, ref, storage add one reference each to what the slot holds
            elif (
                t.is_set_to(ref)
                and not t.requires_grad
                and _getrefcount(t) == 3  # slot.tensor, t, the argument
                and _getrefcount(storage) == slot.s_refs + 1
                and _storage_use_count(slot.cdata) == slot.s_uses
                and _getrefcount(t) == 3
                and _getrefcount(storage) == slot.s_refs + 1
            ):  # quiet: back to its pool (the hot path, inlined)
                del t, ref, storage
                c.bytes_in_use -= slot.reserved
                c.live_blocks -= 1
                self._live.discard(slot)
                home = slot.home
                if home is not None:  # a small slab slot
                    home.append(slot)
                    c.bytes_cached += slot.reserved
                else:  # a medium backing (MediumCache.put inlined)
                    medium = self._medium
                    slot.mq.append(slot)  # type: ignore[union-attr]
                    medium.stamp = slot.lru_stamp = medium.stamp + 1
                    medium.cached_bytes += slot.reserved
                    if medium.cached_bytes > medium.cap_bytes:
                        c.evictions += medium.evict()
                    c.bytes_cached = medium.cached_bytes
            else:  # an alias outlives the release (or the metadata changed): probe later
                del t, ref, storage
                self._pending.append(slot)
        finally:
            lock.release()
        if give_large_back:
            return_to_os(self.device)
