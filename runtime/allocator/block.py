"""Block handles and the per-block record the allocator keeps.

Lifetime rule (the bug this package exists to prevent): a block's memory goes back to its tier
only when the block's *own* storage dies, i.e. when the base tensor, every view made through the
handle and every raw alias (t[0], t.view(...), .numpy(), ...) are gone. Each handed-out block
gets a distinct storage object (an alias of pool memory, or a fresh allocation), so a weakref on
that storage fires exactly then. The `_Record` *is* that weakref; its callback only enqueues it,
which is safe from any thread and from inside the garbage collector.

Handles: the base (`Block`) and each `BlockView` are released once each; the block counts as
released when all of them are. Storage death with handles still outstanding is a leak.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from runtime.errors import UseAfterReleaseError

if TYPE_CHECKING:
    from runtime.allocator.allocator import Allocator


class _Record(weakref.ref):  # type: ignore[type-arg]
    """Bookkeeping of one handed-out block; a weakref to the block's own storage.

    Built with the C-level weakref constructor (`_Record(storage, callback)`) and filled in by the
    allocator: a Python-level __init__ would cost a frame on the hot path.
    """

    __slots__ = (
        "backing",  # pool memory to return: slab slot address or medium tensor; None = direct
        "born_s",  # time.monotonic() at alloc
        "dtype",
        "home",  # the small free list `backing` goes back to; None otherwise
        "is_released",  # every handle (base + views) released
        "nbytes",  # bytes of the requested tensor
        "num_handles",  # base + views not yet released
        "owner",
        "reserved",  # bytes taken from the tier (class size); counted in bytes_in_use
        "serial",
        "shape",
        "tier",
    )
    backing: Any
    born_s: float
    dtype: torch.dtype
    home: list[int] | None
    is_released: bool
    nbytes: int
    num_handles: int
    owner: str
    reserved: int
    serial: int
    shape: tuple[int, ...]
    tier: str


class Block:
    """The base handle of an allocation. `tensor` is valid until `release()`."""

    __slots__ = ("_alloc", "_rec", "_tensor")
    _tensor: torch.Tensor | None

    def __init__(self, alloc: Allocator, rec: _Record, tensor: torch.Tensor) -> None:
        self._alloc, self._rec, self._tensor = alloc, rec, tensor

    @property
    def tensor(self) -> torch.Tensor:
        t = self._tensor
        if t is None:
            raise UseAfterReleaseError(f"block of {self._rec.owner!r} used after release")
        return t

    owner = property(lambda self: self._rec.owner)
    tier = property(lambda self: self._rec.tier)
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
        r = self._rec
        state = "released" if self._tensor is None else "live"
        return f"Block({r.tier}, {r.nbytes}B, owner={r.owner!r}, {state})"


class BlockView:
    """A view of a block made through its handle; released on its own, once."""

    __slots__ = ("_alloc", "_rec", "_tensor", "block")
    _tensor: torch.Tensor | None

    def __init__(self, block: Block, tensor: torch.Tensor) -> None:
        self._alloc, self._rec, self._tensor, self.block = block._alloc, block._rec, tensor, block

    @property
    def tensor(self) -> torch.Tensor:
        t = self._tensor
        if t is None:
            raise UseAfterReleaseError(f"view of {self._rec.owner!r}'s block used after release")
        return t

    is_released = property(lambda self: self._tensor is None)

    def release(self) -> None:
        self._alloc.release(self)
