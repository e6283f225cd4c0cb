"""Block handles and the per-slot record the allocator keeps.

Lifetime rule (the bug this package exists to prevent): a block's memory goes back to its tier
only when the base tensor, every view made through the handle and every raw alias (t[0],
t.view(...), .numpy(), .untyped_storage(), a DLPack capsule, autograd's saved tensors, ...) are
gone. Pooled memory lives in *slots*; each slot owns one storage over its memory and one
persistent tensor on it that every handout of the slot reuses (building a storage per handout
costs more than `torch.empty` itself). When a block's handles are all released, the allocator
checks that nothing but the slot still refers to the tensor or its storage (`tiers.is_quiet`);
a slot with a live alias waits on a pending list and is re-checked later.

Handles: the base (`Block`) and each `BlockView` are released once each; the block counts as
released when all of them are. A handle dropped unreleased is a leak: its `__del__` only queues
the slot (safe from any thread and from inside the garbage collector) and the allocator reclaims
it, counted as a leak with its owner, once every handle is gone and no alias is left.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from runtime.errors import UseAfterReleaseError

if TYPE_CHECKING:
    from runtime.allocator.allocator import Allocator
    from runtime.allocator.tiers import TierCounters


class _Slot:
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
    home: list[_Slot] | None
    is_direct: bool
    keep: torch.Tensor | None
    lru_stamp: int
    mq: list[_Slot] | None
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
        self, counters: TierCounters, reserved: int, home: list[_Slot] | None, is_direct: bool
    ) -> None:
        self.counters, self.tier, self.reserved = counters, counters.name, reserved
        self.home, self.is_direct, self.keep, self.ptr = home, is_direct, None, 0
        self.mq = None
        self.storage = self.tensor = self.ref = self.shape = self.dtype = None
        self.cdata = self.s_refs = self.s_uses = self.lru_stamp = 0
        self.owner, self.born_s, self.nbytes, self.num_handles = "", 0.0, 0, 0
        self.is_leaked = False


class Block:
    """The base handle of an allocation. `tensor` is valid until `release()`."""

    __slots__ = ("_alloc", "_owner", "_rec", "_tensor")
    _tensor: torch.Tensor | None

    def __init__(self, alloc: Allocator, rec: _Slot, tensor: torch.Tensor, owner: str) -> None:
        self._alloc, self._rec, self._tensor, self._owner = alloc, rec, tensor, owner

    def __del__(self) -> None:
        if self._tensor is not None:  # dropped unreleased: a leak, reclaimed by the allocator
            self._alloc._dropped.append(self._rec)

    @property
    def tensor(self) -> torch.Tensor:
        t = self._tensor
        if t is None:
            raise UseAfterReleaseError(f"block of {self._owner!r} used after release")
        return t

    owner = property(lambda self: self._owner)
    tier = property(lambda self: self._rec.tier)
    # size of this handout; only meaningful until release (the slot serves later blocks too)
    nbytes = property(lambda self: self._rec.nbytes)
    reserved_bytes = property(lambda self: self._rec.reserved)
    is_released = property(lambda self: self._tensor is None)

    def derive(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> BlockView:
        """A tracked view `fn(tensor)`: the block stays out of its pool until it is released."""
        return self._alloc._make_view(self, fn)

    def view(self, *shape: int) -> BlockView:
        return self.derive(lambda t: t.view(*shape))

    def narrow(self, dim: int, start: int, length: int) -> BlockView:
        return self.derive(lambda t: t.narrow(dim, start, length))

    def __getitem__(self, index: Any) -> BlockView:
        return self.derive(lambda t: t[index])

    def release(self) -> None:
        self._alloc.release(self)

    def __repr__(self) -> str:
        state = "released" if self._tensor is None else "live"
        return f"Block({self._rec.tier}, owner={self._owner!r}, {state})"


class BlockView:
    """A view of a block made through its handle; released on its own, once."""

    __slots__ = ("_alloc", "_rec", "_tensor", "block")
    _tensor: torch.Tensor | None

    def __init__(self, block: Block, tensor: torch.Tensor) -> None:
        self._alloc, self._rec, self._tensor, self.block = block._alloc, block._rec, tensor, block

    def __del__(self) -> None:
        if self._tensor is not None:  # dropped unreleased: the block leaks
            self._alloc._dropped.append(self._rec)

    @property
    def tensor(self) -> torch.Tensor:
        t = self._tensor
        if t is None:
            raise UseAfterReleaseError(f"view of {self.block.owner!r}'s block used after release")
        return t

    is_released = property(lambda self: self._tensor is None)

    def release(self) -> None:
        self._alloc.release(self)

    def __repr__(self) -> str:
        state = "released" if self._tensor is None else "live"
        return f"BlockView(of {self.block!r}, {state})"
