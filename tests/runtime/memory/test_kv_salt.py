"""Salted prefix keys: pages cached under one salt (a tenant, a request's `cache_salt`) are never
found under another, and the unsalted namespace keeps its keys."""

from __future__ import annotations

from runtime.memory.kv_cache import KVCache
from runtime.memory.kv_pool import salt_root
from tests.runtime.memory.test_kv_cache import BLOCK, make_cache


def fill(cache: KVCache, seq_id: str, tokens: list[int], salt: str = "") -> int:
    """Allocate under `salt`, 'compute' the rest, key the full pages; the cached tokens found.
    The sequence keeps its pages (on CPU a released page may be evicted before a fresh one is
    touched: kv_pool.PagePool.take), so every page stays findable."""
    kv = cache.allocate(seq_id, tokens, salt=salt)
    found = kv.num_cached_tokens
    assert cache.ensure(kv, len(tokens) - kv.num_tokens)
    kv.advance(len(tokens) - kv.num_tokens)
    cache.cache_full_pages(kv, lambda a, b: tokens[a:b])
    return found


def test_a_salted_prefix_is_found_only_under_its_own_salt() -> None:
    cache = make_cache()
    prompt = list(range(100, 111))  # 11 tokens: 2 full pages reusable
    assert fill(cache, "a1", prompt, salt="tenant-a") == 0
    assert fill(cache, "b1", prompt, salt="tenant-b") == 0  # A's pages are not B's
    assert fill(cache, "open", prompt) == 0  # nor the unsalted namespace's
    assert fill(cache, "a2", prompt, salt="tenant-a") == 2 * BLOCK
    assert fill(cache, "b2", prompt, salt="tenant-b") == 2 * BLOCK  # B's own pages: the same hit
    assert fill(cache, "open2", prompt) == 2 * BLOCK


def test_the_empty_salt_keeps_the_unsalted_keys() -> None:
    assert salt_root("") == b""
    assert salt_root("a") != salt_root("b") and len(salt_root("a")) == 16


def test_a_forked_choice_keeps_its_tenants_namespace() -> None:
    """n choices fork after one prefill: the pages a choice fills later are keyed under the
    parent's salt, so another tenant never finds them."""
    cache = make_cache()
    prompt = [7] * (BLOCK - 1)  # no full page yet: the fork's first key chains from the salt
    parent = cache.allocate("p", prompt, salt="tenant-a")
    assert cache.ensure(parent, len(prompt))
    parent.advance(len(prompt))
    child = cache.fork(parent, "p-1")
    assert child is not None and child.salt_key == parent.salt_key == salt_root("tenant-a")
    tokens = [*prompt, 9, 9]
    assert cache.ensure(child, 2)
    child.advance(2)
    cache.cache_full_pages(child, lambda a, b: tokens[a:b])
    assert fill(cache, "b", tokens, salt="tenant-b") == 0  # another tenant: nothing found
    assert fill(cache, "a", tokens, salt="tenant-a") == BLOCK  # its own tenant: the page
