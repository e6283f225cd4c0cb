"""KVCache.fork: n choices over one prompt's KV. Full pages shared by refcount (never copied), the
partial last page copied into a page of the choice's own, nothing taken when there is no room."""

from __future__ import annotations

import torch

from tests.runtime.memory.test_kv_cache import BLOCK, fill, make_cache, rows


def test_full_pages_are_shared_and_the_partial_page_is_copied() -> None:
    cache = make_cache(num_pages=16)
    prompt = list(range(1, 11))  # 10 tokens: two full pages of 4 and 2 tokens on a third
    fill(cache, "p", prompt)
    parent = cache.get("p")
    assert parent is not None
    forks = [cache.fork(parent, f"p#{i}") for i in (1, 2, 3)]
    assert all(kv is not None for kv in forks)
    tables = [parent.page_ids] + [kv.page_ids for kv in forks if kv is not None]
    assert all(t[:2] == parent.page_ids[:2] for t in tables)
    assert [cache.pool.refcounts[p] for p in parent.page_ids[:2]] == [4, 4]
    partials = [t[2] for t in tables]
    assert len(set(partials)) == 4  # one page of its own each
    for page in partials:  # the copy holds the prompt's last two tokens' K/V
        values = cache.pool.data[:, :, :, page, : len(prompt) % BLOCK]  # [L, 2, H, 2, D]
        assert torch.equal(values[..., 0, :], torch.full_like(values[..., 0, :], 9.0))
        assert torch.equal(values[..., 1, :], torch.full_like(values[..., 1, :], 10.0))
    assert all(kv is not None and kv.num_tokens == len(prompt) for kv in forks)
    stats = cache.stats()
    assert stats.num_shared_pages == 2 and stats.num_used_pages == 2 + 4
    assert rows(cache)["kv-cache:shared"] == 2
    for seq_id in ("p", "p#1", "p#2", "p#3"):
        cache.free(seq_id)
    assert cache.stats().num_shared_pages == 0 and cache.stats().num_used_pages == 0


def test_a_prompt_of_whole_pages_copies_nothing() -> None:
    cache = make_cache(num_pages=8)
    fill(cache, "w", list(range(1, 9)))  # two full pages
    parent = cache.get("w")
    assert parent is not None
    used = cache.stats().num_used_pages
    fork = cache.fork(parent, "w#1")
    assert fork is not None and fork.page_ids == parent.page_ids[:2]
    assert cache.stats().num_used_pages == used  # no page taken
    assert cache.ensure(fork, 1) and fork.page_ids[2] != parent.page_ids[-1]


def test_no_page_for_the_copy_is_none_and_takes_nothing() -> None:
    cache = make_cache(num_pages=3)
    fill(cache, "q", list(range(1, 11)))  # all three pages
    parent = cache.get("q")
    assert parent is not None
    refcounts = list(cache.pool.refcounts)
    assert cache.fork(parent, "q#1") is None
    assert cache.pool.refcounts == refcounts and "q#1" not in cache
