"""The page pool's own contract, below the cache: key size, publishing rules, misuse errors."""

from __future__ import annotations

import pytest
import torch

from runtime.memory.kv_pool import PagePool, page_key


def make_pool(num_pages: int = 5) -> PagePool:
    # [layers, 2, kv_heads, pages, page_size, head_dim]
    return PagePool(torch.zeros(1, 2, 1, num_pages, 2, 2))


def test_page_keys_are_16_bytes_over_the_prefix_tokens_and_version() -> None:
    key = page_key(b"", [1, 2], "v1")
    assert len(key) == 16  # the index holds one per cached page: 16 bytes, not 64
    assert page_key(key, [1, 2], "v1") != key  # the previous page's key is part of it
    assert page_key(b"", [1, 2], "v2") != key  # so are the weights
    assert page_key(b"", [2, 1], "v1") != key


def test_publish_keys_a_held_page_once_and_refuses_the_rest() -> None:
    pool = make_pool()
    (page,) = pool.take(1) or [None]
    assert page is not None
    assert pool.publish(page, b"k1") is True and pool.lookup(b"k1") == page
    assert pool.publish(page, b"k2") is False  # a page has one key
    (other,) = pool.take(1) or [None]
    assert other is not None
    assert pool.publish(other, b"k1") is False  # the first page computed with a key stays
    assert pool.lookup(b"k1") == page and not pool.is_keyed(other)
    free_page = pool.free_pages()[0]
    assert pool.publish(free_page, b"k3") is False  # nobody holds it: nothing to key
    assert pool.lookup(b"k3") is None and not pool.is_keyed(free_page)


def test_releasing_more_often_than_held_is_an_error_naming_the_page() -> None:
    pool = make_pool()
    (page,) = pool.take(1) or [None]
    assert page is not None
    pool.release(page)
    with pytest.raises(ValueError, match=f"page {page} released more often than held"):
        pool.release(page)


def test_the_pool_wants_the_kv_layout() -> None:
    with pytest.raises(AssertionError, match=r"^want \[layers, 2, heads, pages, block, dim\]$"):
        PagePool(torch.zeros(1, 3, 1, 4, 2, 2))  # not K and V
    with pytest.raises(AssertionError, match="want"):
        PagePool(torch.zeros(2, 1, 4, 2, 2))
