"""The allocator's memory is on its own device whatever torch's default device is: an engine may
set another default (a GPU) while a CPU allocator serves host buffers, and every tier and path
(slab slots, their first and later fits, misses, the pending list, medium backings, large blocks)
must place its tensors by the allocator's device, never by the default."""

from __future__ import annotations

import pytest
import torch

from runtime.memory import Allocator, Block, tiers
from tests.runtime.memory.conftest import TINY

F32, F64, I16 = torch.float32, torch.float64, torch.int16


def _check(block: Block, shape: tuple[int, ...], dtype: torch.dtype, value: int) -> None:
    t = block.tensor
    assert t.device.type == "cpu" and t.shape == shape and t.dtype == dtype
    t.fill_(value)
    assert int(t.sum()) == value * t.numel()


def _reuse_late(alloc: Allocator, block: Block) -> None:
    raw = block.tensor[:1]
    block.release()  # pending under the alias; reclaimed by the next miss of its class
    del raw


def test_every_path_places_memory_on_the_allocators_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tiers, "_templates", {})  # templates made under this default device
    with torch.device("meta"):
        alloc = Allocator(TINY, device="cpu")
        # the preallocated slabs first: a slot over memory elsewhere must fail here, not crash
        # the process when it is written
        assert {slab.device for slab in alloc._small.slabs} == {torch.device("cpu")}
        assert all(slab.data_ptr() != 0 for slab in alloc._small.slabs)
        small = [alloc.alloc((16,), F32, owner=f"s{i}") for i in range(2)]  # first fits
        for i, b in enumerate(small):
            _check(b, (16,), F32, i + 1)
        small[0].release()
        b = alloc.alloc((8,), F64, owner="refit")  # hot hit, refit for another dtype
        _check(b, (8,), F64, 3)
        miss = alloc.alloc((4, 8), I16, owner="miss")  # class exhausted: a direct block
        _check(miss, (4, 8), I16, 4)
        miss.release()
        _reuse_late(alloc, b)
        b = alloc.alloc((2, 16), I16, owner="late")  # a miss that reclaims and refits
        _check(b, (2, 16), I16, 5)
        for h in (b, small[1]):
            h.release()

        m = alloc.alloc((300,), F32, owner="m")  # medium miss: fresh backing
        _check(m, (300,), F32, 6)
        m.release()
        m = alloc.alloc((150,), F64, owner="m")  # hit, refit
        _check(m, (150,), F64, 7)
        _reuse_late(alloc, m)
        m = alloc.alloc((600,), I16, owner="m")  # miss, reclaim, refit (_medium_hit)
        _check(m, (600,), I16, 8)
        m.release()

        big = alloc.alloc((2000,), F64, owner="L")
        _check(big, (2000,), F64, 9)
        big.release()
        s = alloc.stats()
        assert s.device == "cpu" and s.bytes_in_use == 0 and s.live_blocks == 0
