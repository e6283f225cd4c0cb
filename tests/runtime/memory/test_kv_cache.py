"""The paged KV cache on the tiered allocator: the pool reserved once, pages on demand, prefix
reuse with refcounts, LRU eviction, the leak report's page rows, safe free and close."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from runtime.errors import ConfigError
from runtime.memory import Allocator
from runtime.memory.kv_cache import KVCache
from runtime.memory.kv_pool import SequenceKV

LAYERS, HEADS, HEAD_DIM, BLOCK = 2, 2, 8, 4
BYTES_PER_PAGE = LAYERS * 2 * HEADS * HEAD_DIM * 4 * BLOCK  # float32: 1 KiB


def make_cache(num_pages: int = 16, prefix: bool = True, version: str = "v1") -> KVCache:
    return new_cache(
        max_bytes=(num_pages + 1) * BYTES_PER_PAGE + 100,  # + the zero page, + a remainder
        enable_prefix_caching=prefix,
        model_version=version,
    )


def new_cache(max_bytes: int, **overrides: Any) -> KVCache:
    """A cache of this file's shape on its own allocator; `overrides` replace any argument."""
    args: dict[str, Any] = {
        "num_layers": LAYERS,
        "num_kv_heads": HEADS,
        "head_dim": HEAD_DIM,
        "dtype": torch.float32,
        "device": "cpu",
        "allocator": Allocator(),
        "max_bytes": max_bytes,
        "page_size": BLOCK,
    }
    return KVCache(**{**args, **overrides})


def fill(cache: KVCache, seq_id: str, tokens: list[int]) -> None:
    """Allocate and 'compute' `tokens`: write a recognisable value per token, key full pages."""
    kv = cache.allocate(seq_id, tokens)
    assert cache.ensure(kv, len(tokens) - kv.num_tokens)
    for pos in range(kv.num_tokens, len(tokens)):
        page, slot = kv.page_ids[pos // BLOCK], pos % BLOCK
        kv.data[:, :, :, page, slot] = float(tokens[pos])
    kv.advance(len(tokens) - kv.num_tokens)
    cache.cache_full_pages(kv, lambda a, b: tokens[a:b])


def rows(cache: KVCache) -> dict[str, int]:
    return {b.owner: b.num_handles for b in cache.allocator.leak_report()}


def test_the_pool_is_one_allocator_block_reported_as_pages() -> None:
    cache = make_cache(num_pages=16)
    assert cache.num_pages == 16 and cache.max_tokens == 64
    stats = cache.allocator.stats()
    assert stats.bytes_in_use >= 17 * BYTES_PER_PAGE and stats.live_blocks == 1
    assert rows(cache) == {"kv-cache:free": 16, "kv-cache:zero-page": 1}
    kv = cache.allocate("r1", [])
    assert kv.num_tokens == 0 and kv.capacity == 0  # nothing taken up front
    assert cache.ensure(kv, 5) and len(kv.page_ids) == 2 and kv.capacity == 8
    assert cache.ensure(kv, 3) and len(kv.page_ids) == 2  # still inside page 2
    assert torch.count_nonzero(kv.data[:, :, :, kv.page_ids]) == 0  # handed out zeroed
    assert rows(cache) == {"r1": 2, "kv-cache:free": 14, "kv-cache:zero-page": 1}
    with pytest.raises(ValueError):
        cache.allocate("r1", [])


def test_no_page_is_false_and_takes_nothing() -> None:
    cache = make_cache(num_pages=4)
    a = cache.allocate("a", [])
    assert cache.ensure(a, 12)  # 3 pages
    b = cache.allocate("b", [])
    assert not cache.ensure(b, 8)  # 2 pages, 1 left: none taken
    assert b.page_ids == [] and cache.stats().num_free_pages == 1
    cache.free("a")
    assert cache.ensure(b, 8) and cache.stats().num_free_pages == 2


def test_a_pool_too_small_for_one_page_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as exc:
        KVCache(
            num_layers=LAYERS,
            num_kv_heads=HEADS,
            head_dim=HEAD_DIM,
            dtype=torch.float32,
            device="cpu",
            allocator=Allocator(),
            max_bytes=BYTES_PER_PAGE,  # only the zero page
            page_size=BLOCK,
        )
    assert exc.value.param == "kv_cache_bytes"


def test_the_longest_cached_prefix_is_shared_and_freed_by_its_last_holder() -> None:
    cache = make_cache()
    prompt = list(range(100, 111))  # 11 tokens: pages of 4, 4, 3
    fill(cache, "a", prompt)
    b = cache.allocate("b", [*prompt, 7])  # 12 tokens: the 2 full pages are reused
    a = cache.get("a")
    assert a is not None and b.num_cached_tokens == b.num_tokens == 8
    assert b.page_ids == a.page_ids[:2]
    assert [cache.pool.refcounts[p] for p in b.page_ids] == [2, 2]
    assert rows(cache)["kv-cache:shared"] == 2 and rows(cache)["a"] == 1
    # a prompt one full page long shares no page: its last token must be computed, so the
    # page's first 3 tokens are copied into its own page (test_kv_partial.py)
    c = cache.allocate("c", prompt[:4])
    assert c.num_tokens == 3 and c.page_ids[0] not in a.page_ids
    cache.free("a")
    assert [cache.pool.refcounts[p] for p in b.page_ids] == [1, 1]
    cache.free("b")
    cache.free("c")
    assert rows(cache) == {"kv-cache:cached": 2, "kv-cache:free": 14, "kv-cache:zero-page": 1}
    again = cache.allocate("d", prompt)  # from the cache, contents as computed by a
    assert again.num_tokens == 8
    torch.testing.assert_close(
        again.data[0, 0, 0, again.page_ids[1], :, 0], torch.tensor([104.0, 105, 106, 107])
    )


def test_keys_chain_the_whole_prefix_and_the_model_version() -> None:
    cache = make_cache()
    fill(cache, "a", [1, 2, 3, 4, 5, 6, 7, 8, 0])
    fill(cache, "b", [9, 9, 9, 9, 5, 6, 7, 8, 0])  # the same 2nd page after another 1st one
    a, b = cache.get("a"), cache.get("b")
    assert a is not None and b is not None and a.keys[1] != b.keys[1]
    assert b.num_cached_tokens == 0 and set(a.page_ids).isdisjoint(b.page_ids)
    v2 = make_cache(version="v2")
    fill(v2, "a", [1, 2, 3, 4, 5, 6, 7, 8, 0])
    a2 = v2.get("a")
    assert a2 is not None and a2.keys[0] != a.keys[0]  # other weights, other K/V


def test_unheld_cached_pages_are_evicted_oldest_first_under_pressure() -> None:
    cache = make_cache(num_pages=4)
    fill(cache, "a", [1, 2, 3, 4, 5])  # page a1 keyed, a2 partial
    fill(cache, "b", [9, 9, 9, 9, 5])  # page b1 keyed
    cache.free("a")  # a1 cached (a2 free)
    cache.free("b")  # b1 cached, newer
    assert cache.stats().num_cached_pages == 2 and cache.stats().num_free_pages == 2
    c = cache.allocate("c", [])
    assert cache.ensure(c, 12)  # 3 pages: the 2 free + the oldest cached (a's)
    assert cache.allocate("a2", [1, 2, 3, 4, 5]).num_tokens == 0  # a's prefix is gone
    assert cache.allocate("b2", [9, 9, 9, 9, 5]).num_tokens == 4  # b's is still there


def test_caching_off_keys_nothing() -> None:
    cache = make_cache(prefix=False)
    fill(cache, "a", list(range(9)))
    cache.free("a")
    assert cache.allocate("b", list(range(9))).num_tokens == 0
    assert cache.stats().num_cached_pages == 0


def test_free_is_idempotent_and_a_stale_kv_fails_loudly() -> None:
    cache = make_cache()
    fill(cache, "s", [1, 2, 3])
    kv = cache.get("s")
    assert kv is not None
    cache.free("s")
    assert kv.capacity == 0
    with pytest.raises(ValueError):
        kv.advance(1)
    cache.free("s")  # finished and cancelled may both free
    cache.free("never-allocated")
    assert cache.stats().num_used_pages == 0


def test_close_gives_the_pool_back_to_the_allocator() -> None:
    cache = make_cache()
    allocator = cache.allocator
    fill(cache, "s", [1, 2, 3])
    cache.close()
    assert allocator.stats().bytes_in_use == 0 and allocator.leak_report() == []


def test_on_cpu_cached_pages_are_reused_before_memory_never_written() -> None:
    """An untouched page of the reserved pool is not resident yet: evicting a cached page keeps
    resident memory at the peak of pages in use instead of growing with the cache."""
    cache = make_cache(num_pages=16)
    fill(cache, "a", list(range(1, 10)))  # pages 1, 2 (keyed) and 3
    cache.free("a")
    assert cache.stats().num_cached_pages == 2
    b = cache.allocate("b", [])
    assert cache.ensure(b, 12)  # 3 pages: page 3 (free), then the cached ones, not page 4
    assert sorted(b.page_ids) == [1, 2, 3] and cache.stats().num_cached_pages == 0
    assert cache.ensure(b, 16)  # a 4th page: nothing cached is left, so a new one is touched
    assert b.page_ids[-1] == 4


def test_a_closed_cache_still_reports_and_its_stale_kvs_look_freed() -> None:
    """Until close() has released the block, the allocator's leak report can still call the
    cache's report (a scrape racing the engine's shutdown): the emptied pool keeps its rank, which
    the report unpacks. A stale page table looks like a freed one."""
    cache = make_cache()
    fill(cache, "live", [1, 2, 3, 4, 5])
    fill(cache, "gone", [6, 7])
    kv = cache.get("live")
    assert kv is not None
    cache.free("gone")
    freed_shape = (0,) * 6
    cache.close()
    assert kv.page_ids == [] and kv.capacity == 0 and kv.data.shape == freed_shape
    assert cache.pool.data.shape == freed_shape
    assert cache.num_sequences == 0 and "live" not in cache
    assert isinstance(cache.report(), list)  # no exception
    assert cache.stats().num_pages == 16


def test_membership_capacity_and_available_pages() -> None:
    cache = make_cache(num_pages=4)  # 16 tokens
    assert cache.can_fit(0) and cache.can_fit(16) and not cache.can_fit(17)
    assert "a" not in cache and cache.get("a") is None
    fill(cache, "a", [1, 2, 3, 4, 5])  # page 1 keyed, page 2 partial
    assert "a" in cache and "b" not in cache and cache.num_sequences == 1
    assert cache.num_available_pages() == 2  # free, none cached yet
    cache.free("a")  # page 1 cached, page 2 free
    assert "a" not in cache
    stats = cache.stats()
    assert (stats.num_free_pages, stats.num_cached_pages) == (3, 1)
    assert cache.num_available_pages() == 4  # a cached page can be evicted: it counts


def test_pool_listings_name_the_cached_free_and_keyed_pages() -> None:
    cache = make_cache(num_pages=6)
    fill(cache, "a", [1, 2, 3, 4, 5])
    fill(cache, "b", [9, 9, 9, 9, 5])
    a, b = cache.get("a"), cache.get("b")
    assert a is not None and b is not None
    a_head, b_head = a.page_ids[0], b.page_ids[0]
    assert cache.pool.key_of(a_head) == a.keys[0] and cache.pool.is_keyed(a_head)
    assert cache.pool.key_of(a.page_ids[1]) is None  # partial: never keyed
    cache.free("b")
    cache.free("a")
    assert cache.pool.cached_pages() == [b_head, a_head]  # LRU order: oldest first
    held = {a_head, b_head}
    assert cache.pool.free_pages() == sorted(set(range(1, 7)) - held)


def test_stats_carry_every_count_of_the_pool_and_the_prefix_queries() -> None:
    cache = make_cache(num_pages=5)
    fill(cache, "a", [1, 2, 3, 4, 5])  # 2 pages used
    cache.count_prefix_query(10, 4)
    cache.count_prefix_query(6, 0)
    stats = cache.stats()
    assert stats.page_size == BLOCK and stats.num_pages == 5
    assert (stats.num_used_pages, stats.num_cached_pages, stats.num_free_pages) == (2, 0, 3)
    assert (stats.prefix_query_tokens, stats.prefix_hit_tokens) == (16, 4)
    assert stats.pool_id == cache.pool_id and stats.pool_id.startswith("kv-cache#")


def test_a_scratch_pool_holds_its_capacity_behind_a_zero_page() -> None:
    """SequenceKV.empty: the pool of warm-up, `fastllm doctor` and the tests outside any cache."""
    kv = SequenceKV.empty(2, 3, 4, capacity=10, dtype=torch.float16, device="meta", page_size=4)
    # [layers, 2, kv_heads, pages (+ the zero page), page_size, head_dim]
    assert kv.data.shape == (2, 2, 3, 4, 4, 4)
    assert kv.data.dtype == torch.float16 and kv.data.device.type == "meta"
    assert kv.page_ids == [1, 2, 3] and kv.capacity == 12 and kv.num_tokens == 0
    default = SequenceKV.empty(1, 1, 2, capacity=17)  # 16-token pages on the CPU by default
    assert default.data.shape == (1, 2, 1, 3, 16, 2) and default.page_ids == [1, 2]
    assert default.data.device.type == "cpu" and default.page_size == 16
    assert torch.count_nonzero(default.data) == 0
    exact = SequenceKV.empty(1, 1, 2, capacity=16)
    assert exact.page_ids == [1] and exact.capacity == 16


def test_a_freed_table_is_empty_and_overflow_names_the_capacity() -> None:
    cache = make_cache()
    fill(cache, "s", [1, 2, 3, 4, 5])
    kv = cache.get("s")
    assert kv is not None
    with pytest.raises(ValueError, match=r"KV overflow: 5 \+ 4 > capacity 8"):
        kv.advance(4)
    cache.free("s")
    # nothing of the pool stays reachable from a stale table: no pages, no tokens, no memory
    assert (kv.page_ids, kv.keys, kv.num_tokens, kv.scratch) == ([], [], 0, None)
    assert kv.data.shape == (0,) * 6


def test_keying_again_after_more_tokens_keys_only_the_new_full_pages() -> None:
    """The engine keys full pages after every forward: each page gets exactly one key."""
    cache = make_cache()
    tokens = list(range(1, 14))  # 13 tokens: 3 full pages of 4 and one more token
    kv = cache.allocate("s", tokens[:6])
    assert cache.ensure(kv, 6)
    kv.advance(6)
    cache.cache_full_pages(kv, lambda a, b: tokens[a:b])
    assert len(kv.keys) == 1
    cache.cache_full_pages(kv, lambda a, b: tokens[a:b])  # nothing new filled: nothing new keyed
    assert len(kv.keys) == 1
    assert cache.ensure(kv, 7)
    kv.advance(7)
    cache.cache_full_pages(kv, lambda a, b: tokens[a:b])
    assert len(kv.keys) == 3
    assert [cache.pool.key_of(p) for p in kv.page_ids[:3]] == kv.keys


def test_defaults_the_smallest_pools_and_the_error_for_too_small_a_budget() -> None:
    plain = KVCache(  # the defaults: no page_size, caching flag or model version given
        num_layers=1,
        num_kv_heads=1,
        head_dim=2,
        dtype=torch.float32,
        device="cpu",
        allocator=Allocator(),
        max_bytes=1 << 16,
    )
    assert plain.page_size == 16 and plain.enable_prefix_caching and plain.model_version == ""
    assert new_cache(0).num_pages == 1  # an engine that never generates: the zero page + one
    assert new_cache(2 * BYTES_PER_PAGE).num_pages == 1  # two pages, one of them the zero page
    assert new_cache(2 * BYTES_PER_PAGE // BLOCK, page_size=1).num_pages == 1  # 1-token pages
    with pytest.raises(ConfigError, match=r"holds no page of 4 tokens \(1024 bytes each"):
        new_cache(BYTES_PER_PAGE)
    with pytest.raises(ConfigError, match="kv_block_size=0: a page holds at least one token") as e:
        new_cache(4 * BYTES_PER_PAGE, page_size=0)
    assert e.value.param == "kv_block_size"


def test_pages_for_is_a_whole_number_of_pages() -> None:
    cache = make_cache()
    assert [cache.pages_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    assert all(type(cache.pages_for(n)) is int for n in range(10))


def test_every_table_shares_the_caches_gather_buffer_of_the_pool_dtype() -> None:
    cache = new_cache(8 * BYTES_PER_PAGE, dtype=torch.float16, enable_prefix_caching=False)
    kv = cache.allocate("s", [1, 2, 3])
    assert kv.scratch is cache.scratch and kv.seq_id == "s"
    assert kv.num_cached_tokens == 0 and kv.num_tokens == 0  # caching off: nothing looked up
    with torch.device("meta"):  # another default device: the buffer stays on the pool's
        buffer = cache.scratch.take(8)
    assert buffer.dtype == torch.float16 and buffer.device == torch.device("cpu")
    with pytest.raises(ValueError, match="sequence 's' already has KV"):
        cache.allocate("s", [])
    assert SequenceKV(kv.data).seq_id == ""


def test_each_cache_has_its_own_pool_id_and_reports_its_tier() -> None:
    a, b = make_cache(), make_cache()
    assert a.pool_id != b.pool_id
    assert {row.tier for row in a.report()} == {"small"}
    big = new_cache(2048 * BYTES_PER_PAGE)  # 2 MiB of pages: the allocator's medium tier
    assert {row.tier for row in big.report()} == {"medium"}
    big.close()
