"""Tier behaviour: small free lists and misses, medium LRU cache under its cap, large never cached
and handed back to the OS / driver."""

from __future__ import annotations

import gc

import pytest
import torch

from runtime.engine.stats import TierStats
from runtime.memory import Allocator, AllocatorConfig
from tests.runtime.memory.conftest import resident_bytes

F32 = torch.float32


def tier(alloc: Allocator, name: str) -> TierStats:
    return next(t for t in alloc.stats().tiers if t.tier == name)


def test_small_class_serves_its_slots_then_misses(tiny: Allocator) -> None:
    slab_bytes = tier(tiny, "small").bytes_cached
    blocks = [tiny.alloc((16,), F32, owner=f"s{i}") for i in range(3)]  # 64 B class, 2 slots
    s = tier(tiny, "small")
    assert (s.hits, s.misses) == (2, 1)
    assert s.bytes_in_use == 64 + 64 + 64 and s.bytes_cached == slab_bytes - 128
    for b in blocks:
        b.release()
    s = tier(tiny, "small")
    assert s.bytes_in_use == 0 and s.bytes_cached == slab_bytes  # the miss was not pooled
    again = [tiny.alloc((16,), F32, owner="t") for _ in range(2)]
    assert tier(tiny, "small").hits == 4
    for b in again:
        b.release()


def test_medium_blocks_are_cached_and_reused_by_class(tiny: Allocator) -> None:
    first = tiny.alloc((300,), F32, owner="m")  # 1200 B -> 1280 B class
    ptr = first.tensor.data_ptr()
    first.release()
    m = tier(tiny, "medium")
    assert (m.misses, m.bytes_cached, m.bytes_in_use) == (1, 1280, 0)
    second = tiny.alloc((310,), F32, owner="m")  # same class
    assert second.tensor.data_ptr() == ptr
    assert tier(tiny, "medium").hits == 1
    second.release()


def test_medium_sizes_past_the_memo_bound_still_share_their_class(
    tiny: Allocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the size -> class memo holds one entry; later sizes of the class take the slow lookup
    monkeypatch.setattr(type(tiny._medium), "MAX_MEMO", 1)
    first = tiny.alloc((300,), F32, owner="m")  # 1200 B -> 1280 B class, memoized
    ptr = first.tensor.data_ptr()
    first.release()
    for n in (305, 310, 300):  # same class, not memoized except 300
        b = tiny.alloc((n,), F32, owner="m")
        assert b.tensor.data_ptr() == ptr and b.tensor.shape == (n,)
        b.release()
    m = tier(tiny, "medium")
    assert (m.misses, m.hits, m.bytes_in_use) == (1, 3, 0)
    assert len(tiny._medium.by_nbytes) == 1


def test_medium_cache_evicts_least_recently_used_above_the_cap(tiny: Allocator) -> None:
    # cap 6000 B; 2048 B class x3 = 6144 > cap -> the oldest goes
    blocks = [tiny.alloc((512,), F32, owner=f"m{i}") for i in range(3)]
    ptrs = [b.tensor.data_ptr() for b in blocks]
    for b in blocks:
        b.release()
    m = tier(tiny, "medium")
    assert m.evictions == 1 and m.bytes_cached == 4096 <= 6000
    reused = {tiny.alloc((512,), F32, owner="r").tensor.data_ptr() for _ in range(1)}
    assert ptrs[0] not in reused  # the first returned was evicted
    assert tier(tiny, "medium").bytes_in_use == 0


def test_large_blocks_are_never_cached(tiny: Allocator) -> None:
    for _ in range(3):
        tiny.alloc((2000,), F32, owner="L").release()
    lg = tier(tiny, "large")
    assert (lg.hits, lg.misses, lg.bytes_cached, lg.bytes_in_use) == (0, 3, 0, 0)
    assert lg.releases == 3


def test_large_release_returns_memory_to_the_os() -> None:
    alloc = Allocator(AllocatorConfig(small_blocks_per_class=1))
    nbytes = 200 << 20
    block = alloc.alloc((nbytes // 4,), F32, owner="big")
    assert block.tier == "large"
    address = block.tensor.data_ptr()
    block.tensor.fill_(1.0)  # make every page resident
    assert resident_bytes(address, nbytes) > 190 << 20, (
        "the pages never became resident; the test would prove nothing"
    )
    block.release()
    gc.collect()
    left = resident_bytes(address, nbytes)
    assert left < 16 << 20, f"{left >> 20} MiB of the released block stayed resident"
    assert tier(alloc, "large").bytes_in_use == 0


@pytest.mark.cuda
def test_large_release_returns_memory_to_the_cuda_driver() -> None:
    alloc = Allocator(AllocatorConfig(), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free_before, _ = torch.cuda.mem_get_info()
    block = alloc.alloc((50 << 20,), F32, owner="big")  # 200 MiB
    block.tensor.fill_(1.0)
    torch.cuda.synchronize()
    free_during, _ = torch.cuda.mem_get_info()
    assert free_before - free_during >= 190 << 20
    block.release()
    torch.cuda.synchronize()
    free_after, _ = torch.cuda.mem_get_info()
    assert free_before - free_after < 16 << 20, "the caching allocator kept the large block"


@pytest.mark.cuda
def test_pooled_tiers_work_on_cuda() -> None:
    alloc = Allocator(AllocatorConfig(), device="cuda")
    small = alloc.alloc((256,), torch.float16, owner="s")
    medium = alloc.alloc((1 << 20,), F32, owner="m")
    for b, v in ((small, 1.0), (medium, 2.0)):
        assert b.tensor.is_cuda
        b.tensor.fill_(v)
        assert float(b.tensor.sum()) == v * b.tensor.numel()
        b.release()
    assert alloc.stats().bytes_in_use == 0
