"""Where tier memory lives: small slabs cut into slots with free lists, the medium LRU cache of
slots, one-block direct slots, handing large memory back, and the alias probe that decides when a
slot's memory may be handed out again. Nothing here is thread-safe alone: the allocator calls it
under its lock, or on a slot no other thread can reach.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from runtime.memory.config import AllocatorConfig
from runtime.memory.host_heap import trim_host_heap
from runtime.memory.slot import Slot, TierCounters

# A storage over existing memory that does not own it: each small slab slot gets one of these (a
# distinct StorageImpl, so its use count covers exactly that slot's tensors). The slab is pinned
# to it (`storage._fastllm_keep`), so slab memory is never freed under a live alias, even if the
# allocator itself is dropped first.
storage_from_ptr = torch._C._construct_storage_from_data_pointer


class SmallSlabs:
    """One preallocated slab per power-of-two class, cut into `small_blocks_per_class` slots.

    A slot's storage and tensor are built on its first handout (`fit`), then kept."""

    def __init__(self, config: AllocatorConfig, device: torch.device, c: TierCounters) -> None:
        self.class_bytes = [config.small_class_bytes(i) for i in range(config.num_small_classes)]
        n = config.small_blocks_per_class
        self.slabs = [
            torch.empty(n * b, dtype=torch.uint8, device=device) for b in self.class_bytes
        ]
        # free slots per class; LIFO so a hot slot (and its tensor's shape) is reused first
        self.free: list[list[Slot]] = []
        for slab, b in zip(self.slabs, self.class_bytes, strict=True):
            free: list[Slot] = []
            for i in reversed(range(n)):
                slot = Slot(c, b, free, is_direct=False)
                slot.ptr, slot.keep = slab.data_ptr() + i * b, slab
                free.append(slot)
            self.free.append(free)

    @property
    def total_bytes(self) -> int:
        return sum(s.numel() for s in self.slabs)


class MediumCache:
    """Freed medium slots by class, each list in return order; evicted oldest-first above the cap.

    The LRU order across classes is a return stamp per slot: eviction (rare) looks at the head
    of each class's list, so the hot paths are two list operations and a counter."""

    MAX_MEMO = 4096  # distinct request sizes remembered by `by_nbytes`

    def __init__(self, cap_bytes: int, class_of: Callable[[int], int]) -> None:
        self.cap_bytes = cap_bytes
        self.cached_bytes = 0
        self.stamp = 0  # bumped on every put; a slot's `lru_stamp` says when it came back
        self.class_of = class_of  # request bytes -> class bytes (AllocatorConfig)
        # the allocator's hot paths inline take() and put(): keep them in step
        self.by_class: dict[int, list[Slot]] = {}
        # request bytes -> its class's list, so a hit costs one dict lookup instead of the class
        # arithmetic; bounded (sizes past the bound take `queue_for`, which is only slower)
        self.by_nbytes: dict[int, list[Slot]] = {}

    def queue_for(self, nbytes: int) -> list[Slot]:
        """The free list of the class that serves `nbytes` (created if new). Under the lock:
        eviction iterates `by_class`."""
        reserved = self.class_of(nbytes)
        q = self.by_class.get(reserved)
        if q is None:
            q = self.by_class[reserved] = []
        if len(self.by_nbytes) < self.MAX_MEMO:
            self.by_nbytes[nbytes] = q
        return q

    def take(self, class_bytes: int) -> Slot | None:
        q = self.by_class.get(class_bytes)
        if not q:
            return None
        self.cached_bytes -= class_bytes
        return q.pop()  # most recently returned of this class

    def put(self, slot: Slot) -> int:
        """Cache a quiet slot (no alias left); returns how many slots were evicted."""
        slot.mq.append(slot)  # type: ignore[union-attr]  # its class's list (`new_medium`)
        self.stamp = slot.lru_stamp = self.stamp + 1
        self.cached_bytes += slot.reserved
        return self.evict() if self.cached_bytes > self.cap_bytes else 0

    def evict(self) -> int:
        evicted = 0
        while self.cached_bytes > self.cap_bytes:
            # each list is in return order, so the globally oldest heads one of them
            q = min((q for q in self.by_class.values() if q), key=lambda q: q[0].lru_stamp)
            oldest = q.pop(0)
            self.cached_bytes -= oldest.reserved
            drop_memory(oldest)
            evicted += 1
        return evicted


# --- the persistent tensor of a slot and the alias probe ---------------------------------------
_getrefcount = sys.getrefcount
_storage_use_count = torch._C._storage_Use_Count
_templates: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _empty_like_template(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fresh empty tensor of `dtype` on `device`; `.new()` on a template is the cheapest way."""
    t = _templates.get((dtype, device))
    if t is None:
        t = _templates[(dtype, device)] = torch.empty(0, dtype=dtype, device=device)
    return t.new()


def new_medium(c: TierCounters, reserved: int, mq: list[Slot], device: torch.device) -> Slot:
    """A medium slot over fresh memory of `reserved` bytes (a miss); `mq` is its class's list
    in the MediumCache."""
    slot = Slot(c, reserved, None, is_direct=False)
    slot.mq = mq
    slot.storage = torch.empty(reserved, dtype=torch.uint8, device=device).untyped_storage()
    slot.ptr, slot.cdata = slot.storage.data_ptr(), slot.storage._cdata
    return slot


def new_direct(
    c: TierCounters, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> Slot:
    """A one-block slot over a fresh allocation (large tier, or a small-tier miss)."""
    slot = Slot(c, 0, None, is_direct=True)
    slot.tensor = torch.empty(shape, dtype=dtype, device=device)
    slot.shape, slot.dtype = shape, dtype
    slot.reserved = slot.tensor.numel() * dtype.itemsize
    slot.storage = slot.tensor.untyped_storage()
    slot.ptr, slot.cdata = slot.storage.data_ptr(), slot.storage._cdata
    _measure(slot)
    return slot


def fit(slot: Slot, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """(Re)build a pooled slot's tensor as contiguous `shape` x `dtype` at the start of its memory.

    Only called on a quiet slot (nothing else refers to the old tensor or its storage)."""
    if slot.storage is None:  # a small slab slot's first handout: a storage that does not own
        # its memory (a distinct StorageImpl over the slab), pinning the slab for its aliases
        storage: Any = storage_from_ptr(slot.ptr, device, slot.reserved)
        storage._fastllm_keep = slot.keep
        slot.storage, slot.cdata = storage, storage._cdata
        del storage
    slot.tensor = slot.ref = None
    slot.shape = slot.dtype = None  # until rebuilt: a failure below leaves the slot unfitted
    try:
        s = slot.storage
        tensor = _empty_like_template(dtype, device).set_(s, 0, shape)  # type: ignore[call-overload]
        ref = _empty_like_template(dtype, device).set_(s, 0, shape)  # type: ignore[call-overload]
        slot.tensor, slot.ref, slot.shape, slot.dtype = tensor, ref, shape, dtype
        del tensor, ref, s
    finally:  # the counts of whatever state the slot is in now
        _measure(slot)


def _measure(slot: Slot) -> None:
    """Record the storage's counts when only the slot refers to it (same expressions as below)."""
    slot.s_refs = _getrefcount(slot.storage)
    slot.s_uses = _storage_use_count(slot.cdata)


def is_quiet(slot: Slot) -> bool:
    """True when nothing but the slot refers to its tensor or storage: no view, alias, Python
    reference, storage object, DLPack capsule or autograd saved tensor is left.

    Three counts can each see an alias: the tensor's Python refcount (PyTorch also holds one
    while any C++ owner - a view's base link, a saved tensor, a capsule - shares the TensorImpl),
    the storage object's Python refcount, and the storage's C++ use count (every tensor on it).
    They are read T S U T S, so an alias that moves from one kind to another while they are read
    (another thread turning a view into a storage object, say) is still seen by one of the reads.
    """
    t = slot.tensor
    if t is None:  # an unfitted pooled slot: only the storage can be aliased
        return _storage_quiet(slot)
    ref = slot.ref
    if ref is not None and (not t.is_set_to(ref) or t.requires_grad):
        # the last owner changed the tensor's metadata in place (set_, t_(), resize_,
        # requires_grad_, ...): its counts prove nothing until it is back on the slot's storage
        # with the slot's shape; restore it if nothing else holds it (it is reused as is)
        if _getrefcount(t) != 3:  # slot.tensor, t, the argument
            return False
        t.detach_()  # no autograd history, requires_grad False
        try:
            t.set_(ref)  # type: ignore[call-overload]  # the twin's storage, offset, sizes, strides
        except RuntimeError:  # `.data = x` changed the dtype too, which set_ cannot undo
            t.data = ref
        if not t.is_set_to(ref):
            return False
    storage, cdata = slot.storage, slot.cdata
    return (
        _getrefcount(t) == 3  # slot.tensor, t, the argument
        and _getrefcount(storage) == slot.s_refs + 1  # + the local
        and _storage_use_count(cdata) == slot.s_uses
        and _getrefcount(t) == 3
        and _getrefcount(storage) == slot.s_refs + 1
    )


def _storage_quiet(slot: Slot) -> bool:
    """`is_quiet` for a pooled slot whose `fit` failed: `_measure` ran on the bare storage."""
    if slot.storage is None:
        return True
    return (
        _storage_use_count(slot.cdata) == slot.s_uses
        and _getrefcount(slot.storage) == slot.s_refs
        and _storage_use_count(slot.cdata) == slot.s_uses
    )


def drop_memory(slot: Slot) -> None:
    """Forget a quiet slot's memory: a direct or evicted slot's allocation is freed here."""
    slot.tensor = slot.ref = slot.storage = slot.keep = None
    slot.shape = slot.dtype = None


def return_to_os(device: torch.device) -> None:
    """Hand freed large memory back: a dead tensor's memory sits in PyTorch's caching allocator
    (CUDA) or glibc's free lists (CPU, chunks below the dynamic mmap threshold) otherwise."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "cpu":
        trim_host_heap()
