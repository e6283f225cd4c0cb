"""Prefix reuse by tokens, not only pages: a prompt that ends inside a cached page copies that
page's first tokens into a fresh page (KVCache.allocate, PagePool.best_child). What is reused,
what the probe says beforehand, the copy's contents, eviction, namespaces, and no room."""

from __future__ import annotations

import torch

from runtime.memory.kv_pool import MAX_CHILDREN_SCANNED, child_slot
from tests.runtime.memory.test_kv_cache import BLOCK, fill, make_cache, rows

PROMPT = list(range(100, 111))  # 11 tokens: pages of 4, 4, 3


def test_the_same_prompt_again_reuses_all_but_its_last_token() -> None:
    cache = make_cache()
    fill(cache, "a", [*PROMPT, 55])  # the prompt and one generated token: 3 full pages, keyed
    a = cache.get("a")
    assert a is not None and len(a.keys) == 3
    probe = cache.probe(PROMPT)
    b = cache.allocate("b", PROMPT)
    # 2 whole pages shared, then 2 of the 3rd page's tokens (108, 109) copied; 110 is computed
    assert (probe.num_tokens, probe.num_held_pages) == (10, 2)
    assert b.num_tokens == b.num_cached_tokens == 10
    assert b.page_ids[:2] == a.page_ids[:2] and b.page_ids[2] not in a.page_ids
    assert [cache.pool.refcounts[p] for p in b.page_ids] == [2, 2, 1]
    copied = b.data[0, 0, 0, b.page_ids[2], :, 0]
    torch.testing.assert_close(copied, torch.tensor([108.0, 109, 110, 55]))
    assert not cache.pool.is_keyed(b.page_ids[2])  # the copy is b's own page, unkeyed
    # b computes its last prompt token into slot 2 and goes on: its page is keyed when full
    assert cache.ensure(b, 1)
    b.data[:, :, :, b.page_ids[2], 2] = 110.0
    b.advance(1)
    assert b.num_tokens == 11 and cache.stats().prefix_hit_tokens == 0  # counted by the caller
    cache.free("a")
    cache.free("b")
    assert "b" not in rows(cache) and rows(cache)["kv-cache:cached"] == 3


def test_the_probe_counts_an_idle_source_and_the_longest_continuation_wins() -> None:
    cache = make_cache()
    fill(cache, "y", [*PROMPT[:8], 108, 109, 2, 2])  # 3rd page shares 2 tokens with PROMPT's
    fill(cache, "x", [*PROMPT[:8], 108, 1, 1, 1])  # and this one 1 (copied from y's, then own)
    y, x = cache.get("y"), cache.get("x")
    assert y is not None and x is not None and x.num_cached_tokens == 9
    source, other = y.page_ids[2], x.page_ids[2]
    cache.free("y")  # y's own page is now the oldest cached page
    cache.free("x")
    assert cache.pool.cached_pages()[:2] == [source, other]
    probe = cache.probe(PROMPT)
    assert (probe.num_tokens, probe.num_held_pages, probe.num_idle_pages) == (10, 2, 3)
    before = cache.num_available_pages()
    b = cache.allocate("b", PROMPT)
    assert b.num_tokens == 10
    # the copy's page came from the cache (on CPU a cached page goes before memory never
    # written): the oldest one not held, so not the source, which was held while it was taken
    assert b.page_ids[2] == other
    copied = b.data[0, 0, 0, b.page_ids[2], :, 0]
    torch.testing.assert_close(copied, torch.tensor([108.0, 109, 2, 2]))
    # held: the 2 shared pages; taken: the copy; the source went back to the cache
    assert cache.num_available_pages() == before - 3
    assert cache.pool.cached_pages() == [source]


def test_an_evicted_or_dropped_page_is_no_longer_a_source() -> None:
    cache = make_cache(num_pages=4)
    fill(cache, "a", [1, 2, 3, 4, 5])  # page [1, 2, 3, 4] keyed; [5] partial
    cache.free("a")
    assert cache.allocate("b", [1, 2, 3]).num_tokens == 2
    cache.free("b")
    c = cache.allocate("c", [])
    assert cache.ensure(c, 16)  # every page: the cached one is evicted
    assert cache.pool._children == {} and cache.pool._slot_of == {}
    cache.free("c")
    assert cache.allocate("d", [1, 2, 3]).num_tokens == 0
    cache.free("d")
    fill(cache, "e", [1, 2, 3, 4, 5])
    cache.free("e")
    assert cache.drop_cached() == 1 and cache.pool._children == {}
    assert cache.allocate("f", [1, 2, 3]).num_tokens == 0


def test_other_weights_and_other_tenants_copy_nothing() -> None:
    cache = make_cache(version="v1")
    fill(cache, "a", [1, 2, 3, 4, 5])
    assert cache.allocate("salted", [1, 2, 3], salt="tenant-b").num_tokens == 0
    other = make_cache(version="v2")
    fill(other, "a", [9, 9, 9, 9, 5])
    assert child_slot(b"", "v1") != child_slot(b"", "v2")
    assert cache.allocate("b", [1, 2, 3]).num_tokens == 2


def test_no_room_for_the_copy_reuses_the_whole_pages_only() -> None:
    cache = make_cache(num_pages=4)
    fill(cache, "a", [*PROMPT, 55])  # 3 pages held by a
    hog = cache.allocate("hog", [])
    assert cache.ensure(hog, BLOCK)  # the last page
    b = cache.allocate("b", PROMPT)
    assert b.num_tokens == 8 and len(b.page_ids) == 2  # nothing copied, nothing leaked
    assert (
        cache.stats().num_free_pages == 0 and cache.pool.refcounts[cache.get("a").page_ids[2]] == 1
    )  # type: ignore[union-attr]


def test_every_copy_is_reported_for_tensor_parallel_workers() -> None:
    cache = make_cache()
    copies: list[tuple[int, int]] = []
    cache.on_page_copy = lambda source, dest: copies.append((source, dest))
    fill(cache, "a", [*PROMPT, 55])
    a = cache.get("a")
    b = cache.allocate("b", PROMPT)
    assert a is not None and copies == [(a.page_ids[2], b.page_ids[2])]
    assert cache.ensure(b, 1)
    b.advance(1)  # 11 tokens: its 3rd page is partial
    fork = cache.fork(b, "b-1")
    assert fork is not None and copies[-1] == (b.page_ids[2], fork.page_ids[2])


def test_the_scan_is_bounded_to_the_newest_continuations() -> None:
    cache = make_cache(num_pages=2 * MAX_CHILDREN_SCANNED + 4)
    fill(cache, "old", [7, 7, 7, 0])  # shares 3 tokens with the probe below
    cache.free("old")
    for i in range(MAX_CHILDREN_SCANNED):
        fill(cache, f"n{i}", [7, 1000 + i, 0, 0])  # share 1 token each
        cache.free(f"n{i}")
    assert cache.probe([7, 7, 7, 7, 7]).num_tokens == 1  # the old one is past the scan
    fill(cache, "new", [7, 7, 7, 0])
    assert cache.probe([7, 7, 7, 7, 7]).num_tokens == 3
