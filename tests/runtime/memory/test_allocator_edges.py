"""Allocator edge paths: a miss that reclaims a pending or dropped slot and refits it for another
shape / dtype, a refit that fails leaving the pools intact, exact per-tier counters, handle reprs
and narrow views, and handing large memory back to the OS / driver."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import pytest
import torch

from runtime.engine.stats import TierStats
from runtime.errors import DoubleReleaseError, ForeignBlockError, UseAfterReleaseError
from runtime.memory import Allocator, LiveBlock, tiers
from runtime.memory.slot import Slot, TierCounters
from tests.runtime.memory.conftest import TINY

F32, I32 = torch.float32, torch.int32
CPU = torch.device("cpu")


def by_tier(alloc: Allocator) -> dict[str, TierStats]:
    return {t.tier: t for t in alloc.stats().tiers}


def counts(t: TierStats) -> tuple[int, ...]:
    return (t.hits, t.misses, t.evictions, t.releases, t.leaks, t.live_blocks)


# 64 B class requests of another shape / dtype than the slot's last tensor (16 x float32)
SMALL_REQUESTS = [((16,), F32), ((4, 4), F32), ((16,), I32), ((2, 8), I32)]


@pytest.mark.parametrize("how", ["pending", "dropped"])
@pytest.mark.parametrize(("shape", "dtype"), SMALL_REQUESTS)
def test_an_exhausted_small_class_reclaims_a_quiet_slot_for_any_shape(
    tiny: Allocator,
    how: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> None:
    slab = by_tier(tiny)["small"].bytes_cached
    a = tiny.alloc((16,), F32, owner="a")  # the 64 B class has 2 slots
    b = tiny.alloc((16,), F32, owner="b")
    ptr = a.tensor.data_ptr()
    if how == "pending":  # released under a raw alias: waits on the pending list
        raw = a.tensor[1:]
        a.release()
        del raw
    else:  # dropped unreleased: queued by __del__, a leak once reclaimed
        del a
    c = tiny.alloc(shape, dtype, owner="c")  # class exhausted: the miss reclaims a's slot
    assert c.tensor.data_ptr() == ptr
    assert c.tensor.shape == shape and c.tensor.dtype == dtype and c.tensor.is_contiguous()
    assert c.nbytes == 64 and c.reserved_bytes == 64 and c.owner == "c"
    c.tensor.fill_(5)
    b.tensor.fill_(1)
    assert int(c.tensor.sum()) == 80 and int(b.tensor.sum()) == 16
    s = by_tier(tiny)["small"]
    released, leaked = (1, 0) if how == "pending" else (0, 1)
    assert counts(s) == (3, 0, 0, released, leaked, 2)
    assert (s.bytes_in_use, s.bytes_cached) == (128, slab - 128)
    [entry] = [e for e in tiny.leak_report() if e.owner == "c"]
    assert (entry.nbytes, entry.reserved_bytes, entry.tier) == (64, 64, "small")
    assert entry.shape == shape and entry.dtype == str(dtype).removeprefix("torch.")
    assert 0.0 <= entry.age_s < 60.0
    c.release()
    b.release()
    s = by_tier(tiny)["small"]
    assert (s.bytes_in_use, s.bytes_cached, s.live_blocks) == (0, slab, 0)


def test_a_small_miss_with_nothing_quiet_is_a_direct_block_with_its_size(tiny: Allocator) -> None:
    slab = by_tier(tiny)["small"].bytes_cached
    a = tiny.alloc((16,), F32, owner="a")
    b = tiny.alloc((16,), F32, owner="b")
    raw = a.tensor[1:]
    a.release()  # pending, but its alias is alive: the next miss cannot reuse it
    c = tiny.alloc((3, 5), F32, owner="c")
    assert c.nbytes == 60 and c.reserved_bytes == 60 and c.tensor.shape == (3, 5)
    s = by_tier(tiny)["small"]
    assert counts(s) == (2, 1, 0, 1, 0, 3)
    assert (s.bytes_in_use, s.bytes_cached) == (64 + 64 + 60, slab - 128)
    [entry] = [e for e in tiny.leak_report() if e.owner == "c"]
    assert (entry.nbytes, entry.reserved_bytes, entry.shape) == (60, 60, (3, 5))
    del raw
    c.release()
    b.release()
    s = by_tier(tiny)["small"]
    assert (s.bytes_in_use, s.bytes_cached, s.releases) == (0, slab, 3)


def test_a_failed_small_refit_keeps_the_slot_in_its_class(tiny: Allocator) -> None:
    slab = by_tier(tiny)["small"].bytes_cached
    bad = (-1, -16)  # 64 bytes by the product, but no tensor has that shape
    with pytest.raises(RuntimeError):  # the hot path's refit fails
        tiny.alloc(bad, F32, owner="bad")
    a = tiny.alloc((16,), F32, owner="a")
    b = tiny.alloc((16,), F32, owner="b")  # both slots were still there
    raw = b.tensor[1:]
    b.release()
    del raw  # b's slot is pending and quiet: the next miss reclaims it, then fails to refit it
    with pytest.raises(RuntimeError):
        tiny.alloc(bad, F32, owner="bad")
    s = by_tier(tiny)["small"]
    assert counts(s) == (2, 0, 0, 1, 0, 1)
    assert (s.bytes_in_use, s.bytes_cached) == (64, slab - 64)
    c = tiny.alloc((4, 4), F32, owner="c")  # the reclaimed slot is back in its class
    assert c.tensor.shape == (4, 4)
    assert counts(by_tier(tiny)["small"]) == (3, 0, 0, 1, 0, 2)
    a.release()
    c.release()
    assert by_tier(tiny)["small"].bytes_cached == slab


# 1280 B class requests (the slot's last tensor is 300 x float32)
MEDIUM_REQUESTS = [((300,), F32), ((310,), F32), ((300,), I32), ((10, 30), F32), ((4, 80), I32)]


@pytest.mark.parametrize("how", ["pending", "dropped"])
@pytest.mark.parametrize(("shape", "dtype"), MEDIUM_REQUESTS)
def test_a_medium_miss_reclaims_a_quiet_backing_for_any_shape_of_its_class(
    tiny: Allocator,
    how: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> None:
    first = tiny.alloc((300,), F32, owner="first")  # a miss: fresh 1280 B backing
    ptr = first.tensor.data_ptr()
    first.release()
    a = tiny.alloc((300,), F32, owner="a")  # a hit on it
    assert a.tensor.data_ptr() == ptr
    if how == "pending":
        raw = a.tensor[:1]
        a.release()
        del raw
    else:
        del a
    nbytes = shape[0] * (shape[1] if len(shape) > 1 else 1) * dtype.itemsize
    c = tiny.alloc(shape, dtype, owner="c")  # the class list is empty: reclaim, then take
    assert c.tensor.data_ptr() == ptr
    assert c.tensor.shape == shape and c.tensor.dtype == dtype and c.tensor.is_contiguous()
    assert c.nbytes == nbytes and c.reserved_bytes == 1280 and c.tier == "medium"
    c.tensor.fill_(2)
    assert int(c.tensor.sum()) == 2 * c.tensor.numel()
    m = by_tier(tiny)["medium"]
    released, leaked = (2, 0) if how == "pending" else (1, 1)
    assert counts(m) == (2, 1, 0, released, leaked, 1)
    assert (m.bytes_in_use, m.bytes_cached) == (1280, 0)
    [entry] = tiny.leak_report()
    assert (entry.owner, entry.nbytes, entry.reserved_bytes) == ("c", nbytes, 1280)
    assert entry.shape == shape and 0.0 <= entry.age_s < 60.0
    c.release()
    m = by_tier(tiny)["medium"]
    assert (m.bytes_in_use, m.bytes_cached, m.live_blocks) == (0, 1280, 0)


def test_a_failed_medium_refit_puts_the_backing_back_in_the_cache(tiny: Allocator) -> None:
    # three 2048 B backings released: the cap (6000 B) evicts the oldest, 4096 B stay cached
    for b in [tiny.alloc((512,), F32, owner=f"e{i}") for i in range(3)]:
        b.release()
    bad = (-1, -300)  # 1200 bytes by the product (the 1280 B class), but not a shape
    a = tiny.alloc((300,), F32, owner="a")
    ptr = a.tensor.data_ptr()
    a.release()
    with pytest.raises(RuntimeError):  # a hit whose refit fails
        tiny.alloc(bad, F32, owner="bad")
    m = by_tier(tiny)["medium"]
    assert counts(m) == (0, 4, 1, 4, 0, 0)
    assert (m.bytes_in_use, m.bytes_cached) == (0, 4096 + 1280)
    a = tiny.alloc((300,), F32, owner="a")  # the backing is still cached
    assert a.tensor.data_ptr() == ptr
    raw = a.tensor[:1]
    a.release()
    del raw  # pending and quiet: the next miss of the class reclaims it, then fails to refit
    with pytest.raises(RuntimeError):
        tiny.alloc(bad, F32, owner="bad")
    m = by_tier(tiny)["medium"]
    assert counts(m) == (1, 4, 1, 5, 0, 0)
    assert (m.bytes_in_use, m.bytes_cached) == (0, 4096 + 1280)
    c = tiny.alloc((10, 30), F32, owner="c")
    assert c.tensor.data_ptr() == ptr and c.tensor.shape == (10, 30)
    assert counts(by_tier(tiny)["medium"]) == (2, 4, 1, 5, 0, 1)
    c.release()


def test_reprs_say_tier_owner_and_whether_live(tiny: Allocator) -> None:
    small = tiny.alloc((16,), F32, owner="req-1")
    view = small[:2]
    assert repr(small) == "Block(small, owner='req-1', live)"
    assert repr(view) == "BlockView(of Block(small, owner='req-1', live), live)"
    view.release()
    assert repr(view) == "BlockView(of Block(small, owner='req-1', live), released)"
    small.release()
    assert repr(small) == "Block(small, owner='req-1', released)"
    assert repr(view) == "BlockView(of Block(small, owner='req-1', released), released)"
    for numel, name in ((600, "medium"), (2000, "large")):
        b = tiny.alloc((numel,), F32, owner="o")
        v = b.view(numel)
        b.release()
        assert repr(v) == f"BlockView(of Block({name}, owner='o', released), live)"
        v.release()
        assert repr(b) == f"Block({name}, owner='o', released)"


@pytest.mark.parametrize("numel", [8, 300, 2000])  # small, medium, large
def test_narrow_is_a_tracked_view_of_the_span(tiny: Allocator, numel: int) -> None:
    block = tiny.alloc((4, numel), F32, owner="n")
    block.tensor.copy_(torch.arange(4 * numel, dtype=F32).view(4, numel))
    cols = block.narrow(1, 2, 3)
    rows = block.narrow(0, 1, 2)
    assert cols.tensor.shape == (4, 3) and rows.tensor.shape == (2, numel)
    assert torch.equal(cols.tensor, block.tensor[:, 2:5])
    assert torch.equal(rows.tensor, block.tensor[1:3])
    assert cols.tensor.data_ptr() == block.tensor.data_ptr() + 2 * 4
    assert rows.tensor.data_ptr() == block.tensor.data_ptr() + numel * 4
    assert cols.block is block and rows.block is block
    block.release()
    rows.release()
    assert by_tier(tiny)[block.tier].live_blocks == 1  # cols still holds it
    cols.tensor.fill_(0)
    cols.release()
    assert tiny.stats().live_blocks == 0 and tiny.stats().bytes_in_use == 0


def test_return_to_os_trims_the_host_heap_or_empties_the_cuda_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(tiers, "trim_host_heap", lambda: calls.append("trim"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    tiers.return_to_os(torch.device("cpu"))
    assert calls == ["trim"]
    tiers.return_to_os(torch.device("cuda", 0))
    assert calls == ["trim", "empty_cache"]
    tiers.return_to_os(torch.device("meta"))  # nothing to hand back
    assert calls == ["trim", "empty_cache"]


@pytest.mark.parametrize("return_large", [True, False])
def test_only_large_memory_goes_back_to_the_os_and_only_when_configured(
    monkeypatch: pytest.MonkeyPatch, return_large: bool
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(tiers, "trim_host_heap", lambda: calls.append("trim"))
    alloc = Allocator(dataclasses.replace(TINY, return_large_to_os=return_large))
    for numel in (16, 600):  # pooled tiers keep their memory
        alloc.alloc((numel,), F32, owner="p").release()
    for _ in range(3):  # a small miss is freed, but it is not large memory
        held = [alloc.alloc((16,), F32, owner="s") for _ in range(3)]
        for b in held:
            b.release()
    assert calls == []
    alloc.alloc((2000,), F32, owner="L").release()
    assert calls == (["trim"] if return_large else [])
    big = alloc.alloc((2000,), F32, owner="L")
    raw = big.tensor[1:]
    big.release()  # an alias: freed (and handed back) only when it dies and a probe sees it
    assert calls == (["trim"] if return_large else [])
    del raw
    alloc.collect()
    assert calls == (["trim", "trim"] if return_large else [])
    assert by_tier(alloc)["large"].bytes_in_use == 0
    # pooled memory coming back from the pending list is not handed to the OS either
    for numel in (16, 600):
        b = alloc.alloc((numel,), F32, owner="p")
        raw = b.tensor[1:]
        b.release()
        del raw
        alloc.collect()
    alloc.stats()
    assert calls == (["trim", "trim"] if return_large else [])


def test_a_large_alloc_first_frees_large_memory_left_on_the_pending_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(tiers, "trim_host_heap", lambda: calls.append("trim"))
    alloc = Allocator(dataclasses.replace(TINY, return_large_to_os=True))
    big = alloc.alloc((2000,), F32, owner="L1")
    raw = big.tensor[1:]
    big.release()
    del raw  # dead, but only a probe can tell
    assert calls == []
    again = alloc.alloc((2000,), F32, owner="L2")  # probes before taking fresh large memory
    assert calls == ["trim"]
    # one probe that finds a large and then a pooled slot quiet still hands memory back
    raws = [again.tensor[1:]]
    again.release()
    small = alloc.alloc((16,), F32, owner="s")
    raws.append(small.tensor[1:])
    small.release()
    del raws
    alloc.collect()
    assert calls == ["trim", "trim"]
    s = by_tier(alloc)
    assert (s["large"].bytes_in_use, s["small"].bytes_in_use, s["large"].misses) == (0, 0, 2)


def _bare_storage_slot() -> Slot:
    """A pooled slot with memory but no tensor (what a failed `fit` leaves), measured bare."""
    slot = Slot(TierCounters("medium"), 1280, None, is_direct=False)
    slot.storage = torch.empty(1280, dtype=torch.uint8).untyped_storage()
    slot.cdata = slot.storage._cdata
    tiers._measure(slot)
    return slot


def test_the_probe_of_a_slot_without_a_tensor_sees_storage_aliases() -> None:
    never_fitted = Slot(TierCounters("small"), 64, [], is_direct=False)
    assert tiers.is_quiet(never_fitted)  # no memory of its own yet: nothing can alias it
    slot = _bare_storage_slot()
    assert tiers.is_quiet(slot)
    storage_ref = slot.storage  # a Python reference to the storage object
    assert not tiers.is_quiet(slot)
    del storage_ref
    assert tiers.is_quiet(slot)
    alias = torch.empty(0, dtype=torch.uint8).set_(slot.storage)  # a tensor on the storage
    assert not tiers.is_quiet(slot)
    del alias
    assert tiers.is_quiet(slot)


@pytest.mark.parametrize(
    ("request_shape", "shape"),
    [(16, (16,)), ([4, 4], (4, 4)), ((2, 8), (2, 8)), (600, (600,)), ([2, 1000], (2, 1000))],
)
def test_a_shape_may_be_an_int_a_list_or_a_tuple(
    tiny: Allocator, request_shape: int | list[int] | tuple[int, ...], shape: tuple[int, ...]
) -> None:
    block = tiny.alloc(request_shape, F32, owner="s")
    assert block.tensor.shape == shape and block.nbytes == 4 * block.tensor.numel()
    [entry] = tiny.leak_report()
    assert entry.shape == shape and type(entry.shape) is tuple
    block.release()
    again = tiny.alloc(shape, F32, owner="s")  # the same slot, no refit needed
    assert again.tensor.shape == shape
    again.release()


@pytest.mark.parametrize(
    ("nbytes", "tier_name", "reserved"),
    [
        (1, "small", 64),
        (4, "small", 64),
        (32, "small", 64),
        (63, "small", 64),
        (64, "small", 64),
        (65, "small", 128),
        (100, "small", 128),
        (128, "small", 128),
        (129, "small", 256),
        (512, "small", 512),
        (513, "small", 1024),
        (1023, "small", 1024),
        (1024, "medium", 1024),
        (1025, "medium", 1280),
        (2049, "medium", 2560),
        (4096, "medium", 4096),
        (4097, "large", 4097),
    ],
)
def test_a_request_takes_the_smallest_class_of_its_tier(
    tiny: Allocator, nbytes: int, tier_name: str, reserved: int
) -> None:
    block = tiny.alloc((nbytes,), torch.uint8, owner="c")
    assert (block.tier, block.nbytes, block.reserved_bytes) == (tier_name, nbytes, reserved)
    block.tensor.fill_(9)
    assert int(block.tensor.sum()) == 9 * nbytes
    stats = by_tier(tiny)
    assert stats[tier_name].bytes_in_use == reserved
    assert sum(t.hits + t.misses for t in stats.values()) == 1
    assert stats[tier_name].hits == (1 if tier_name == "small" else 0)
    block.release()
    assert tiny.stats().bytes_in_use == 0


@pytest.mark.parametrize("numel", [16, 300])  # small (64 B class), medium (1280 B class)
def test_a_released_slot_is_handed_out_again_first_in_any_shape_and_dtype(
    tiny: Allocator, numel: int
) -> None:
    first = tiny.alloc((numel,), F32, owner="a")
    ptr = first.tensor.data_ptr()
    tier_name = first.tier
    first.release()
    # the hot path reuses the slot just released (small: LIFO; medium: latest of the class)
    # each differs from the one before in shape or in dtype only (or in neither, first)
    requests = [((numel,), F32), ((numel,), I32), ((4, numel // 4), I32), ((4, numel // 4), F32)]
    requests += [((numel // 2,), torch.float64), ((numel,), F32)]
    for n, (shape, dtype) in enumerate(requests, start=1):
        b = tiny.alloc(shape, dtype, owner=f"r{n}")
        assert b.tensor.data_ptr() == ptr
        assert b.tensor.shape == shape and b.tensor.dtype == dtype and b.tensor.is_contiguous()
        assert b.nbytes == 4 * numel and b.owner == f"r{n}"
        assert repr(b) == f"Block({tier_name}, owner='r{n}', live)"
        b.tensor.fill_(n)
        assert int(b.tensor.sum()) == n * b.tensor.numel()
        view = b[:1]
        b.release()
        view.release()  # the last handle out returns the slot
        t = by_tier(tiny)[tier_name]
        assert (t.hits, t.misses) == ((n + 1, 0) if tier_name == "small" else (n, 1))
        assert (t.bytes_in_use, t.live_blocks) == (0, 0)


@pytest.mark.parametrize("mutate", [lambda t: t.unsqueeze_(0), lambda t: t.t_()])
@pytest.mark.parametrize("numel", [16, 600])
@pytest.mark.parametrize("dtype", [F32, I32])
def test_an_in_place_metadata_change_is_undone_at_the_first_probe(
    tiny: Allocator, mutate: object, numel: int, dtype: torch.dtype
) -> None:
    shape = (4, numel // 4)
    block = tiny.alloc(shape, dtype, owner="old")
    ptr = block.tensor.data_ptr()
    mutate(block.tensor)  # type: ignore[operator]
    block.release()
    s = tiny.stats()  # the first probe restores the tensor and takes the slot back
    assert (s.live_blocks, s.bytes_in_use) == (0, 0)
    b = tiny.alloc(shape, dtype, owner="new")
    assert b.tensor.data_ptr() == ptr and b.tensor.shape == shape and b.tensor.dtype == dtype
    assert b.tensor.is_contiguous()
    b.release()
    assert tiny.stats().bytes_in_use == 0


@pytest.mark.parametrize("numel", [16, 600])
def test_a_changed_tensor_still_held_keeps_its_slot_out(tiny: Allocator, numel: int) -> None:
    block = tiny.alloc((4, numel // 4), F32, owner="old")
    ptr = block.tensor.data_ptr()
    held = block.tensor
    held.t_()  # changed in place and kept past release
    block.release()
    fresh = [tiny.alloc((4, numel // 4), F32, owner=f"new{i}") for i in range(3)]
    assert all(f.tensor.data_ptr() != ptr for f in fresh)
    assert all(f.tensor is not held for f in fresh)
    assert [e.owner for e in tiny.leak_report() if e.is_released] == ["old"]
    del held
    assert tiny.stats().live_blocks == 3
    for f in fresh:
        f.release()
    assert tiny.stats().bytes_in_use == 0


@pytest.mark.parametrize("numel", [16, 600])
def test_a_view_dropped_then_the_base_released_is_one_leak(tiny: Allocator, numel: int) -> None:
    block = tiny.alloc((numel,), F32, owner="req-v")
    tier_name = block.tier
    view = block[:1]
    del view  # dropped unreleased
    assert tiny.stats().live_blocks == 1  # counted as dropped; the base is still out
    block.release()
    t = by_tier(tiny)[tier_name]
    assert (t.leaks, t.releases, t.live_blocks, t.bytes_in_use) == (1, 0, 0, 0)
    assert [(e.owner, e.tier) for e in tiny.recent_leaks()] == [("req-v", tier_name)]
    again = tiny.alloc((numel,), F32, owner="next")
    assert by_tier(tiny)[tier_name].hits == (2 if tier_name == "small" else 1)
    again.release()


def test_leaks_are_counted_per_tier(tiny: Allocator) -> None:
    for owner in ("l1", "l2"):
        tiny.alloc((16,), F32, owner=owner)  # dropped at once
    tiny.alloc((600,), F32, owner="l3")
    stats = by_tier(tiny)
    assert (stats["small"].leaks, stats["medium"].leaks, stats["large"].leaks) == (2, 1, 0)
    assert sorted(e.owner for e in tiny.recent_leaks()) == ["l1", "l2", "l3"]
    assert tiny.stats().bytes_in_use == 0


def test_misuse_errors_say_what_went_wrong(tiny: Allocator) -> None:
    other = Allocator(TINY)
    foreign = other.alloc((16,), F32, owner="x")
    with pytest.raises(ForeignBlockError, match=r"was not allocated by this allocator$"):
        tiny.release(foreign)
    with pytest.raises(ForeignBlockError, match=r"^tensor.*was not allocated by this allocator$"):
        tiny.release(torch.zeros(2))  # type: ignore[arg-type]
    foreign.release()
    block = tiny.alloc((16,), F32, owner="x")
    block.release()
    with pytest.raises(DoubleReleaseError, match=r"^Block\(small, owner='x', released\) released"):
        block.release()
    block = tiny.alloc((16,), F32, owner="y")
    message = r"^derive\(fn\): fn must return a view of the block, not a new tensor$"
    with pytest.raises(ValueError, match=message):
        block.derive(lambda t: t.clone())
    block.release()
    with pytest.raises(UseAfterReleaseError, match=r"^block of 'y' used after release$"):
        block.view(16)


@pytest.mark.parametrize("numel", [16, 600, 2000])
def test_a_block_released_while_a_view_is_being_made_is_used_after_release(
    tiny: Allocator, numel: int
) -> None:
    block = tiny.alloc((numel,), F32, owner="racer")

    def release_then_view(t: torch.Tensor) -> torch.Tensor:
        block.release()  # what another thread could do between the check and the lock
        return t[:1]

    with pytest.raises(UseAfterReleaseError, match=r"^block of 'racer' used after release$"):
        block.derive(release_then_view)
    s = tiny.stats()
    assert (s.live_blocks, s.bytes_in_use) == (0, 0)
    assert sum(t.releases for t in s.tiers) == 1


def test_stats_name_the_device(tiny: Allocator) -> None:
    assert tiny.stats().device == "cpu"


@pytest.mark.parametrize("dtype", [torch.float64, I32, torch.float16])
def test_large_blocks_have_the_dtype_and_size_asked_for(
    tiny: Allocator, dtype: torch.dtype
) -> None:
    block = tiny.alloc((3, 1000), dtype, owner="big")
    nbytes = 3000 * dtype.itemsize
    assert block.tier == "large" and block.tensor.dtype == dtype and block.tensor.shape == (3, 1000)
    assert block.nbytes == nbytes and block.reserved_bytes == nbytes
    [entry] = tiny.leak_report()
    assert (entry.owner, entry.nbytes, entry.tier) == ("big", nbytes, "large")
    assert 0.0 <= entry.age_s < 60.0
    block.release()


@pytest.mark.parametrize("dtype", [torch.float64, I32, torch.float16, torch.uint8])
def test_a_medium_miss_has_the_dtype_asked_for(tiny: Allocator, dtype: torch.dtype) -> None:
    numel = 2400 // dtype.itemsize  # 2400 B -> the 2560 B class
    block = tiny.alloc((numel,), dtype, owner="m")
    assert block.tensor.dtype == dtype and block.tensor.shape == (numel,)
    assert (block.nbytes, block.reserved_bytes, block.owner) == (2400, 2560, "m")
    block.release()


@pytest.mark.parametrize("numel", [16, 600, 2000])
def test_a_block_storage_is_exactly_its_reserved_bytes(tiny: Allocator, numel: int) -> None:
    block = tiny.alloc((numel,), F32, owner="s")
    storage = block.tensor.untyped_storage()
    assert storage.nbytes() == block.reserved_bytes == {16: 64, 600: 2560, 2000: 8000}[numel]
    assert storage.data_ptr() == block.tensor.data_ptr()
    del storage
    block.release()
    assert tiny.stats().bytes_in_use == 0


def test_a_raw_alias_of_a_small_block_pins_its_slab_past_the_allocator() -> None:
    alloc = Allocator(TINY)
    block = alloc.alloc((16,), F32, owner="a")
    block.tensor.fill_(7.0)
    raw = block.tensor[2:]
    slab = weakref.ref(alloc._small.slabs[0])  # the 64 B class's slab
    block.release()
    del block, alloc
    gc.collect()
    assert slab() is not None, "the slab was freed under a live alias"
    assert torch.all(raw == 7.0)
    del raw
    gc.collect()
    assert slab() is None  # and nothing else keeps it


def _rows(owner: str, nbytes: int) -> list[LiveBlock]:
    return [LiveBlock(owner, nbytes, nbytes, "small", 0.0, (nbytes,), "uint8", 1, False)]


@pytest.mark.parametrize("numel", [16, 600])
def test_a_breakdown_stands_for_its_block_only_while_the_block_is_out(
    tiny: Allocator, numel: int
) -> None:
    other = tiny.alloc((8,), F32, owner="other")
    tiny.set_breakdown(other, lambda: _rows("other-row", 32))
    pool = tiny.alloc((numel,), F32, owner="pool")
    tiny.set_breakdown(pool, lambda: _rows("page-row", 4 * numel))
    assert sorted(e.owner for e in tiny.leak_report()) == ["other-row", "page-row"]
    plain = tiny.alloc((numel,), F32, owner="plain")  # no breakdown: reported as itself
    plain.release()  # another block's release leaves the breakdowns alone
    pool.release()
    assert [e.owner for e in tiny.leak_report()] == ["other-row"]
    # the slot serves a new block, reported as itself, not as the old rows
    reuse = tiny.alloc((numel,), F32, owner="reuse")
    assert sorted(e.owner for e in tiny.leak_report()) == ["other-row", "reuse"]
    reuse.release()
    other.release()
    assert tiny.leak_report() == []


@pytest.mark.parametrize("numel", [16, 600])
def test_a_dropped_block_loses_its_breakdown_when_reclaimed(tiny: Allocator, numel: int) -> None:
    keep = tiny.alloc((8,), F32, owner="keep")
    tiny.set_breakdown(keep, lambda: _rows("keep-row", 32))
    pool = tiny.alloc((numel,), F32, owner="pool")
    tiny.set_breakdown(pool, lambda: _rows("page-row", 4 * numel))
    ptr = pool.tensor.data_ptr()
    del pool  # dropped unreleased: reclaimed as a leak by the next probe
    assert [e.owner for e in tiny.leak_report()] == ["keep-row"]
    assert [e.owner for e in tiny.recent_leaks()] == ["pool"]
    reuse = tiny.alloc((numel,), F32, owner="reuse")
    assert reuse.tensor.data_ptr() == ptr
    assert sorted(e.owner for e in tiny.leak_report()) == ["keep-row", "reuse"]
    reuse.release()
    keep.release()
    assert tiny.leak_report() == []


def test_recent_leaks_keep_the_last_256(tiny: Allocator) -> None:
    for i in range(300):
        tiny.alloc((16,), F32, owner=f"l{i}")  # dropped at once: a leak of its owner
    leaks = tiny.recent_leaks()
    assert [e.owner for e in leaks] == [f"l{i}" for i in range(44, 300)]
    assert by_tier(tiny)["small"].leaks == 300


def test_the_small_tier_preallocates_its_slabs_byte_for_byte(tiny: Allocator) -> None:
    # 64 B .. 1 KiB classes, 2 slots each: what bytes_cached reports is the memory held
    expected = 2 * (64 + 128 + 256 + 512 + 1024)
    slabs = tiny._small.slabs
    assert sum(s.untyped_storage().nbytes() for s in slabs) == expected
    assert by_tier(tiny)["small"].bytes_cached == expected


def test_a_block_whose_data_was_replaced_by_another_dtype_is_taken_back(tiny: Allocator) -> None:
    """`tensor.data = x` of another dtype, then release: the next probe restores the slot (it
    used to raise from set_ on every later probe, so stats() and every miss failed for good)."""
    block = tiny.alloc((16,), torch.float32, owner="x")
    ptr = block.tensor.data_ptr()
    block.tensor.data = torch.zeros(3, dtype=torch.int64)
    block.release()
    stats = tiny.stats()  # probes the pending slot
    assert stats.live_blocks == 0 and tiny.leak_report() == []
    again = tiny.alloc((16,), torch.float32, owner="y")
    assert again.tensor.data_ptr() == ptr and again.tensor.dtype == torch.float32
    assert again.tensor.shape == (16,)
    again.release()
