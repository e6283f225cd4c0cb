"""KVCache on the tiered allocator: budget, buckets, owner tags, prompt reuse, safe free."""

from __future__ import annotations

import pytest
import torch

from runtime.memory import Allocator, AllocatorConfig
from runtime.memory.kv_cache import KVCache, SequenceKV, bucket_tokens

LAYERS, HEADS, HEAD_DIM = 2, 2, 8
BYTES_PER_TOKEN = LAYERS * 2 * HEADS * HEAD_DIM * 4  # float32: 256 B


def make_cache(max_tokens: int = 1024, allocator: Allocator | None = None) -> KVCache:
    return KVCache(
        num_layers=LAYERS,
        num_kv_heads=HEADS,
        head_dim=HEAD_DIM,
        dtype=torch.float32,
        device="cpu",
        allocator=allocator or Allocator(AllocatorConfig(small_blocks_per_class=4)),
        max_bytes=max_tokens * BYTES_PER_TOKEN,
    )


@pytest.mark.parametrize("n", [1, 63, 64, 65, 200, 256, 257, 300, 513, 1000, 4097, 100_000])
def test_buckets_cover_the_request_with_bounded_waste(n: int) -> None:
    cap = bucket_tokens(n)
    assert cap >= n and cap % 64 == 0
    assert cap - n < 64 or cap <= n * 1.25
    assert bucket_tokens(cap) == cap


def test_allocate_gives_zeroed_kv_owned_by_the_sequence() -> None:
    cache = make_cache()
    kv = cache.allocate("seq-1", 100)
    assert isinstance(kv, SequenceKV)
    assert kv.data.shape == (LAYERS, 2, HEADS, 128, HEAD_DIM) and kv.capacity == 128
    assert kv.num_tokens == 0 and torch.count_nonzero(kv.data) == 0
    assert [b.owner for b in cache.allocator.leak_report()] == ["seq-1"]
    assert cache.num_sequences == 1 and "seq-1" in cache and cache.get("seq-1") is kv
    assert cache.num_used_bytes == 128 * BYTES_PER_TOKEN
    assert cache.num_free_bytes == cache.max_bytes - cache.num_used_bytes
    with pytest.raises(ValueError):
        cache.allocate("seq-1", 10)
    cache.free("seq-1")


def test_no_room_is_none_and_freeing_makes_room() -> None:
    cache = make_cache(max_tokens=256)
    a = cache.allocate("a", 100)  # 128
    b = cache.allocate("b", 128)  # 128
    assert a is not None and b is not None
    assert not cache.can_allocate(1)
    assert cache.allocate("c", 1) is None
    assert cache.num_sequences == 2
    cache.free("a")
    assert cache.can_allocate(64)
    assert cache.allocate("c", 64) is not None


def test_a_sequence_that_fits_exactly_is_not_refused_by_rounding() -> None:
    cache = make_cache(max_tokens=300)  # bucket(300) = 320 > 300
    assert cache.can_allocate(300)
    kv = cache.allocate("long", 300)
    assert kv is not None and kv.capacity == 300
    assert cache.allocate("more", 1) is None


def test_free_releases_at_once_and_is_idempotent() -> None:
    cache = make_cache()
    kv = cache.allocate("s", 64)
    assert kv is not None
    kv.k(0)[:, :3].fill_(1.0)
    kv.advance(3)
    cache.free("s")
    assert cache.allocator.stats().bytes_in_use == 0
    assert cache.num_used_bytes == 0 and cache.num_sequences == 0
    assert kv.capacity == 0 and kv.block is None  # a stale SequenceKV fails loudly
    with pytest.raises(ValueError):
        kv.advance(1)
    cache.free("s")  # finished and cancelled may both free
    cache.free("never-allocated")


def test_freed_blocks_are_reused_by_size_class() -> None:
    cache = make_cache()
    for n in (100, 1000):  # small tier (32 KiB) and medium tier (256 KiB -> 1024 tokens)
        first = cache.allocate("x", n)
        assert first is not None
        ptr = first.data.data_ptr()
        cache.free("x")
        again = cache.allocate("y", n - 10)  # same bucket
        assert again is not None and again.data.data_ptr() == ptr
        assert torch.count_nonzero(again.data) == 0  # the old sequence's K/V is not visible
        cache.free("y")
    hits = sum(t.hits for t in cache.allocator.stats().tiers)
    assert hits >= 3


def test_a_stale_view_of_freed_kv_keeps_its_memory_out_of_the_pool() -> None:
    cache = make_cache()
    kv = cache.allocate("old", 64)
    assert kv is not None
    stale_k = kv.k(0)  # e.g. held by a model that kept a reference
    stale_k.fill_(5.0)
    cache.free("old")
    new = cache.allocate("new", 64)
    assert new is not None
    assert new.data.data_ptr() != stale_k.data_ptr()
    new.data.fill_(-1.0)
    assert torch.all(stale_k == 5.0)
    [held] = [b for b in cache.allocator.leak_report() if b.owner == "old"]
    assert held.is_released
    del stale_k
    assert [b.owner for b in cache.allocator.leak_report()] == ["new"]
