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

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import torch

from runtime.errors import UseAfterReleaseError
from runtime.memory.slot import Slot


class HandleOwner(Protocol):
    """What a handle needs of the allocator that made it (allocator.Allocator implements it);
    a protocol here so handles and the allocator do not import each other."""

    _dropped: deque[Slot]

    def release(self, block: Block | BlockView) -> None: ...

    def _make_view(self, block: Block, fn: Callable[[torch.Tensor], torch.Tensor]) -> BlockView: ...


class Block:
    """The base handle of an allocation. `tensor` is valid until `release()`."""

    __slots__ = ("_alloc", "_owner", "_rec", "_tensor")
    _tensor: torch.Tensor | None

    def __init__(self, alloc: HandleOwner, rec: Slot, tensor: torch.Tensor, owner: str) -> None:
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
