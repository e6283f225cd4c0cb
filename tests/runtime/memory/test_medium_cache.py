"""The medium tier's cache: backings kept by size class, reused latest first, evicted least
recently returned first once the cached bytes pass the cap (and not before), with exact counters,
whether a block comes back at its release or later from the pending list."""

from __future__ import annotations

import dataclasses

import torch

from runtime.engine.stats import TierStats
from runtime.memory import Allocator, Block
from tests.runtime.memory.conftest import TINY

F32 = torch.float32


def medium(alloc: Allocator) -> TierStats:
    return next(t for t in alloc.stats().tiers if t.tier == "medium")


def ptr(block: Block) -> int:
    return block.tensor.data_ptr()


def release_later(alloc: Allocator, block: Block) -> None:
    """Release under a raw alias, so the block waits on the pending list; then let the alias die
    and probe, so the backing goes into the cache by the slow path (not at its release)."""
    raw = block.tensor[:1]
    block.release()
    del raw
    alloc.collect()


def test_the_latest_returned_backing_of_a_class_is_reused_first(tiny: Allocator) -> None:
    x = tiny.alloc((300,), F32, owner="x")
    y = tiny.alloc((300,), F32, owner="y")
    px, py = ptr(x), ptr(y)
    x.release()
    assert medium(tiny).bytes_cached == 1280  # in the cache as soon as it is released
    y.release()
    z = tiny.alloc((300,), F32, owner="z")
    assert ptr(z) == py
    w = tiny.alloc((310,), F32, owner="w")
    assert ptr(w) == px
    m = medium(tiny)
    assert (m.hits, m.misses, m.bytes_cached, m.bytes_in_use) == (2, 2, 0, 2560)
    z.release()
    w.release()


def test_classes_never_share_backings(tiny: Allocator) -> None:
    small_class = tiny.alloc((300,), F32, owner="a")  # 1280 B class
    p = ptr(small_class)
    small_class.release()
    bigger = tiny.alloc((500,), F32, owner="b")  # 2000 B -> the 2048 B class: a miss
    assert bigger.reserved_bytes == 2048 and ptr(bigger) != p
    smaller = tiny.alloc((256,), F32, owner="c")  # 1024 B -> the 1024 B class: a miss
    assert smaller.reserved_bytes == 1024 and ptr(smaller) != p
    m = medium(tiny)
    assert (m.hits, m.misses, m.bytes_cached, m.bytes_in_use) == (0, 3, 1280, 3072)
    bigger.release()
    smaller.release()
    assert medium(tiny).bytes_cached == 1280 + 2048 + 1024
    again = tiny.alloc((320,), F32, owner="d")  # 1280 B class: its own backing
    assert ptr(again) == p and again.reserved_bytes == 1280
    assert medium(tiny).bytes_cached == 2048 + 1024  # exactly the other two classes' backings
    again.release()


def test_a_hit_takes_its_bytes_out_of_the_cache(tiny: Allocator) -> None:
    blocks = [tiny.alloc((n,), F32, owner="m") for n in (300, 500, 256)]  # 1280, 2048, 1024
    for b in blocks:
        b.release()
    assert medium(tiny).bytes_cached == 4352
    taken = tiny.alloc((500,), F32, owner="t")
    assert medium(tiny).bytes_cached == 4352 - 2048
    taken.release()
    assert medium(tiny).bytes_cached == 4352


def test_a_cache_filled_exactly_to_its_cap_evicts_nothing() -> None:
    alloc = Allocator(dataclasses.replace(TINY, medium_cache_bytes=4096))
    a, b, c = (alloc.alloc((512,), F32, owner=f"m{i}") for i in range(3))  # 2048 B each
    pa, pb = ptr(a), ptr(b)
    a.release()
    b.release()  # at its release: 4096 cached, not above the cap
    m = medium(alloc)
    assert (m.evictions, m.bytes_cached) == (0, 4096)
    c.release()  # now above: the least recently returned (a) goes
    m = medium(alloc)
    assert (m.evictions, m.bytes_cached) == (1, 4096)
    held = [alloc.alloc((512,), F32, owner="r") for _ in range(2)]
    assert pa not in {ptr(h) for h in held} and pb in {ptr(h) for h in held}
    assert medium(alloc).misses == 3
    for h in held:
        h.release()
    # the same through the pending list (MediumCache.put, not the release's inlined put)
    d, e = (alloc.alloc((512,), F32, owner=f"p{i}") for i in range(2))
    pd, pe = ptr(d), ptr(e)
    d.release()
    release_later(alloc, e)  # 4096 B cached again: not above the cap
    m = medium(alloc)
    assert (m.evictions, m.bytes_cached, m.hits, m.misses) == (1, 4096, 4, 3)
    again = [alloc.alloc((512,), F32, owner="g") for _ in range(2)]
    assert {ptr(g) for g in again} == {pd, pe}
    for g in again:
        g.release()


def test_evictions_add_up_over_every_path(tiny: Allocator) -> None:
    # 1280 + 1280 + 2048 cached, then a 4096 B block comes back: three go at once
    a, b, c = (tiny.alloc((n,), F32, owner="m") for n in (300, 300, 512))
    d = tiny.alloc((1024,), F32, owner="d")  # 4096 B class
    pd = ptr(d)
    for h in (a, b, c, d):
        h.release()
    m = medium(tiny)
    assert (m.evictions, m.bytes_cached) == (3, 4096)
    # through the pending list: a 2048 B backing comes back late and pushes d out
    e = tiny.alloc((512,), F32, owner="e")
    d2 = tiny.alloc((1024,), F32, owner="d2")
    assert ptr(d2) == pd
    d2.release()  # the 4096 B backing is cached again, newer than nothing else
    release_later(tiny, e)  # 4096 + 2048 > cap: d2's backing (older) goes
    m = medium(tiny)
    assert (m.evictions, m.bytes_cached) == (4, 2048)
    # at a release again: a 4096 B block returns above the cap, e's backing goes
    f = tiny.alloc((1024,), F32, owner="f")
    assert medium(tiny).misses == 6  # d2's backing was evicted: fresh memory
    f.release()
    m = medium(tiny)
    assert (m.evictions, m.bytes_cached, m.releases) == (5, 4096, 7)
    g = tiny.alloc((512,), F32, owner="g")
    assert (medium(tiny).misses, medium(tiny).hits) == (7, 1)  # e's backing was evicted
    g.release()


def test_lru_order_holds_across_the_pending_path(tiny: Allocator) -> None:
    a, b, c = (tiny.alloc((512,), F32, owner=f"m{i}") for i in range(3))  # 2048 B each
    pa, pb, pc = ptr(a), ptr(b), ptr(c)
    a.release()  # returned first, at its release
    release_later(tiny, b)  # returned second, by the probe
    c.release()  # third: 6144 B > cap, the least recently returned (a) goes
    m = medium(tiny)
    assert (m.evictions, m.bytes_cached) == (1, 4096)
    held = [tiny.alloc((512,), F32, owner="r") for _ in range(2)]
    assert {ptr(h) for h in held} == {pb, pc}
    assert pa not in {ptr(h) for h in held}
    for h in held:
        h.release()
