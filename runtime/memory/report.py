"""What `leak_report()` and the leak log return: who holds memory, how much, since when."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from runtime.memory.slot import Slot


@dataclass(frozen=True)
class LiveBlock:
    """A block whose memory is not back in its tier."""

    owner: str  # request id or subsystem given to alloc()
    nbytes: int  # bytes of the tensor asked for
    reserved_bytes: int  # bytes taken from the tier (size class); what bytes_in_use counts
    tier: str  # small | medium | large
    age_s: float  # seconds since alloc
    shape: tuple[int, ...]
    dtype: str
    num_handles: int  # base + views not yet released
    # True when every handle was released but a raw alias (t[0], .numpy(), ...) still holds the
    # storage: the memory stays out of the pool until that alias dies
    is_released: bool


@dataclass(frozen=True)
class LeakEvent:
    """A block reclaimed after a handle of it was dropped unreleased (and its aliases died)."""

    owner: str
    nbytes: int
    reserved_bytes: int
    tier: str
    age_s: float  # how long it lived
    ts: float  # wall clock when it was reclaimed


def live_blocks(records: Iterable[Slot]) -> list[LiveBlock]:
    now = time.monotonic()
    out = [
        LiveBlock(
            owner=r.owner,
            nbytes=r.nbytes,
            reserved_bytes=r.reserved,
            tier=r.tier,
            age_s=now - r.born_s,
            shape=r.shape or (),  # () only after an in-place metadata change dropped the tensor
            dtype=str(r.dtype).removeprefix("torch."),
            num_handles=r.num_handles,
            is_released=r.num_handles == 0 and not r.is_leaked,
        )
        for r in records
    ]
    out.sort(key=lambda b: b.age_s, reverse=True)  # oldest first: likeliest leaks
    return out


def leak_event(r: Slot) -> LeakEvent:
    return LeakEvent(
        r.owner, r.nbytes, r.reserved, r.tier, time.monotonic() - r.born_s, time.time()
    )
