"""Paged KV: page tables over the page pool (kv_pool.py), with prefix reuse.

`SequenceKV` (kv_pool.py) is what the models read and write: the pool tensor, the sequence's page
table (`page_ids`, token i lives in page_ids[i // page_size] at slot i % page_size) and its cursor.
A model's forward writes the new tokens' K/V at positions [num_tokens, num_tokens + n) and
attends over [0, num_tokens + n); the caller then calls `advance(n)` once. The model never
advances the cursor itself, so every layer of one forward sees the same `num_tokens`.

`KVCache` (the verbs the scheduler uses; every one under one lock):
  probe(token_ids)             what allocate would find, taking nothing: the scheduler asks
                               before it admits, so admission never allocates and frees again
  allocate(seq_id, token_ids)  a page table starting with the longest cached prefix (full pages,
                               refcounted, then the first tokens of a cached page copied into
                               a fresh one; at most all but the last token, so one is computed)
  ensure(kv, n)                pages for n more tokens, appended as needed: no max_tokens
                               reservation; False (nothing taken) when no page is free or cached
  fork(parent, seq_id)         a page table for another choice of the same prompt: the parent's
                               full pages held once more, its partial last page copied
  trim(kv, num_tokens)         give back the pages past num_tokens (speculation's rollback)
  cache_full_pages(kv, tokens) key the pages the last forward filled, for later sequences
  free(seq_id)                 release every page: a shared page is freed by its last holder;
                               a keyed page then stays cached (LRU) until evicted
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from runtime.errors import ConfigError
from runtime.memory.gather_scratch import GatherScratch
from runtime.memory.kv_pool import (
    PagePool,
    PrefixProbe,
    SequenceKV,
    TokenSlice,
    child_slot,
    page_key,
    salt_root,
)
from runtime.memory.kv_report import pool_rows
from runtime.memory.stats import KVCacheStats

if TYPE_CHECKING:
    from runtime.memory import Allocator, LiveBlock


class KVCache:
    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        allocator: Allocator,
        max_bytes: int,
        page_size: int = 16,
        enable_prefix_caching: bool = True,
        model_version: str = "",
        owner: str = "kv-cache",
    ) -> None:
        self.page_size, self.dtype, self.device = page_size, dtype, torch.device(device)
        self.enable_prefix_caching, self.model_version = enable_prefix_caching, model_version
        self.bytes_per_token = num_layers * 2 * num_kv_heads * head_dim * dtype.itemsize
        self.bytes_per_page = page_size * self.bytes_per_token
        if page_size < 1:  # before the division below (settings check it too: ge=1)
            raise ConfigError(
                f"kv_block_size={page_size}: a page holds at least one token",
                param="kv_block_size",
            )
        # the zero page included; max_bytes 0: the smallest pool (an engine that never generates)
        num_pages = max_bytes // self.bytes_per_page if max_bytes else 2
        if num_pages < 2:
            raise ConfigError(
                f"kv_cache_bytes={max_bytes} holds no page of {page_size} tokens "
                f"({self.bytes_per_page} bytes each, one of them the zero page)",
                param="kv_cache_bytes",
            )
        shape = (num_layers, 2, num_kv_heads, num_pages, page_size, head_dim)
        block = allocator.alloc(shape, dtype, owner=owner)
        self.pool = PagePool(block.tensor)
        self.max_bytes, self.owner, self.allocator = max_bytes, owner, allocator
        self.tier = allocator.config.tier_of(num_pages * self.bytes_per_page)
        self.num_query_tokens = self.num_hit_tokens = 0
        self._seqs: dict[str, SequenceKV] = {}
        self._lock = threading.Lock()
        self.born_s = time.monotonic()
        self.pool_id = f"{owner}#{id(self):x}"
        self.scratch = GatherScratch(dtype, self.device)
        # told of every page copy (a fork's partial page, a partial prefix hit): tensor-parallel
        # workers make the same copy in their pools before the next forward (tp/leader.py)
        self.on_page_copy: Callable[[int, int], None] | None = None
        allocator.set_breakdown(block, self.report)
        # the block goes back when the engine closes the cache, or when the cache is dropped
        self._close = weakref.finalize(self, allocator.release, block)

    # --- capacity ------------------------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return self.pool.num_usable

    @property
    def max_tokens(self) -> int:
        """Tokens one sequence could ever hold: every page of the pool."""
        return self.pool.num_usable * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def can_fit(self, num_tokens: int) -> bool:
        return self.pages_for(num_tokens) <= self.pool.num_usable

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    def get(self, seq_id: str) -> SequenceKV | None:
        return self._seqs.get(seq_id)

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    # --- the verbs -----------------------------------------------------------------------------
    def allocate(self, seq_id: str, token_ids: Sequence[int], salt: str = "") -> SequenceKV:
        """A page table for a sequence about to run; its first pages are the longest cached
        prefix of `token_ids` (kv.num_tokens = kv.num_cached_tokens tokens already stored) among
        the pages cached under the same `salt` (a tenant's namespace; "" = the shared one)."""
        with self._lock:
            if seq_id in self._seqs:
                raise ValueError(f"sequence {seq_id!r} already has KV")
            kv = SequenceKV(self.pool.data, seq_id, self.scratch)
            kv.salt_key = salt_root(salt)
            if self.enable_prefix_caching:
                self._reuse_prefix(kv, token_ids)
            self._seqs[seq_id] = kv
            return kv

    def probe(self, token_ids: Sequence[int], salt: str = "") -> PrefixProbe:
        """What `allocate(_, token_ids, salt)` would start from, with nothing taken."""
        with self._lock:
            if not self.enable_prefix_caching:
                return PrefixProbe(0, 0, 0)
            salt_key = salt_root(salt)
            found = self._cached_prefix(salt_key, token_ids)
            pages = [page for page, _ in found]
            num_tokens = len(pages) * self.page_size
            partial = self._partial(salt_key, token_ids, found)
            if partial is not None:
                pages.append(partial[0])
                num_tokens += partial[1]
            idle = sum(1 for page in pages if self.pool.refcounts[page] == 0)
            return PrefixProbe(num_tokens, idle, len(found))

    def _cached_prefix(self, salt_key: bytes, token_ids: Sequence[int]) -> list[tuple[int, bytes]]:
        """(page, key) of the longest run of cached full pages `token_ids` starts with."""
        size, found = self.page_size, []
        prev = salt_key
        for i in range((len(token_ids) - 1) // size):  # the last token is always computed
            key = page_key(prev, token_ids[i * size : (i + 1) * size], self.model_version)
            page = self.pool.lookup(key)
            if page is None:
                break
            found.append((page, key))
            prev = key
        return found

    def _partial(
        self, salt_key: bytes, token_ids: Sequence[int], found: list[tuple[int, bytes]]
    ) -> tuple[int, int] | None:
        """(page, n): a keyed page after the cached whole pages `found` whose first n tokens
        come next in `token_ids` (the last token excluded: it is always computed)."""
        start = len(found) * self.page_size
        rest = token_ids[start : len(token_ids) - 1]
        slot = child_slot(found[-1][1] if found else salt_key, self.model_version)
        return self.pool.best_child(slot, rest[: self.page_size - 1])

    def _reuse_prefix(self, kv: SequenceKV, token_ids: Sequence[int]) -> None:
        found = self._cached_prefix(kv.salt_key, token_ids)
        for page, key in found:
            self.pool.hold(page)
            kv.page_ids.append(page)
            kv.keys.append(key)
        kv.num_tokens = len(kv.page_ids) * self.page_size
        partial = self._partial(kv.salt_key, token_ids, found)
        if partial is not None:
            # Tokens, not only pages: a prompt that ends inside a cached page (the same prompt
            # again, a shared prefix one page long and a little more) copies that page's K/V
            # into a fresh page and computes only what follows. The whole page is copied, as a
            # fork copies (and as tensor-parallel workers replay it): slots past the cursor hold
            # the source's later tokens, masked like anything past a sequence's cursor.
            source, num = partial
            self.pool.hold(source)  # so taking the fresh page cannot evict it
            taken = self.pool.take(1)
            if taken is not None:
                self._copy_page(source, taken[0])
                kv.page_ids.append(taken[0])
                kv.num_tokens += num
            self.pool.release(source)
        kv.num_cached_tokens = kv.num_tokens

    def _copy_page(self, source: int, dest: int) -> None:
        data = self.pool.data  # [layers, 2, heads, pages, block, dim]
        data[:, :, :, dest] = data[:, :, :, source]
        if self.on_page_copy is not None:
            self.on_page_copy(source, dest)

    def ensure(self, kv: SequenceKV, num_new_tokens: int) -> bool:
        """Make room for `num_new_tokens` more tokens; False (nothing taken) if no room."""
        with self._lock:
            need = self.pages_for(kv.num_tokens + num_new_tokens) - len(kv.page_ids)
            if need <= 0:
                return True
            pages = self.pool.take(need)
            if pages is None:
                return False
            kv.page_ids.extend(pages)
            return True

    def trim(self, kv: SequenceKV, num_tokens: int) -> None:
        """Give back the pages past the first `num_tokens` tokens (and past the cursor): the
        pages a speculative step took for drafted positions the target rejected. They were never
        keyed (only pages under the cursor are), so they go straight back to the free list."""
        with self._lock:
            keep = self.pages_for(max(num_tokens, kv.num_tokens))
            while len(kv.page_ids) > keep:
                self.pool.release(kv.page_ids.pop())

    def fork(self, parent: SequenceKV, seq_id: str) -> SequenceKV | None:
        """A page table for `seq_id` holding the parent's stored tokens (n choices of one prompt,
        after its one prefill). Full pages are shared: held once more, never copied (a full page
        is never written again). The partial last page is the one page each choice writes its
        own next tokens into, so it is copied into a fresh page (copy-on-write, at most
        page_size - 1 tokens). None (nothing taken) when no page is free for that copy."""
        with self._lock:
            if seq_id in self._seqs:
                raise ValueError(f"sequence {seq_id!r} already has KV")
            num_full = parent.num_tokens // self.page_size
            copied: list[int] = []
            if parent.num_tokens % self.page_size:
                taken = self.pool.take(1)
                if taken is None:
                    return None
                copied = taken
                self._copy_page(parent.page_ids[num_full], copied[0])
            kv = SequenceKV(self.pool.data, seq_id, self.scratch)
            for page in parent.page_ids[:num_full]:
                self.pool.hold(page)
            kv.page_ids = parent.page_ids[:num_full] + copied
            kv.keys = parent.keys[:num_full]
            kv.salt_key = parent.salt_key  # the choice's pages stay in its tenant's namespace
            kv.num_tokens = parent.num_tokens
            self._seqs[seq_id] = kv
            return kv

    def num_available_pages(self) -> int:
        """Pages `ensure` could take now (free, or cached and evictable)."""
        return self.pool.num_free + self.pool.num_cached

    def cache_full_pages(self, kv: SequenceKV, tokens: TokenSlice) -> None:
        """Key every page the cursor has filled since the last call (prefix caching on)."""
        if not self.enable_prefix_caching:
            return
        size = self.page_size
        with self._lock:
            if kv.seq_id not in self._seqs:  # freed meanwhile (cancelled)
                return
            for i in range(len(kv.keys), kv.num_tokens // size):
                prev = kv.keys[-1] if kv.keys else kv.salt_key
                page_tokens = tokens(i * size, (i + 1) * size)
                key = page_key(prev, page_tokens, self.model_version)
                slot = child_slot(prev, self.model_version)
                self.pool.publish(kv.page_ids[i], key, slot, page_tokens)
                kv.keys.append(key)

    def count_prefix_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        with self._lock:
            self.num_query_tokens += num_tokens
            self.num_hit_tokens += num_hit_tokens

    def free(self, seq_id: str) -> None:
        """Release a sequence's pages; a no-op for an unknown or already freed id."""
        with self._lock:
            kv = self._seqs.pop(seq_id, None)
            if kv is None:
                return
            # last page first: the head of a prefix becomes the newest cached page, so eviction
            # takes a chain from its tail and what stays cached is still reachable from its head
            for page in reversed(kv.page_ids):
                self.pool.release(page)
            kv.page_ids, kv.keys, kv.num_tokens = [], [], 0  # capacity 0: a stale use fails
            kv.data, kv.scratch = kv.data.new_empty((0,) * 6), None

    def drop_cached(self) -> int:
        """Forget the prefix cache's unheld pages (PagePool.drop_cached)."""
        with self._lock:
            return self.pool.drop_cached()

    def close(self) -> None:
        """Give the pool's memory back (engine shutdown); the cache is unusable afterwards."""
        with self._lock:
            for kv in self._seqs.values():
                kv.page_ids, kv.data = [], kv.data.new_empty((0,) * 6)
            self._seqs.clear()
            self.pool.data = self.pool.data.new_empty((0,) * 6)
        self.scratch.release()
        self._close()

    # --- reports -------------------------------------------------------------------------------
    def stats(self) -> KVCacheStats:
        pool = self.pool
        with self._lock:
            return KVCacheStats(
                page_size=self.page_size,
                num_pages=pool.num_usable,
                num_used_pages=pool.num_used,
                num_cached_pages=pool.num_cached,
                num_free_pages=pool.num_free,
                num_shared_pages=pool.num_shared,
                prefix_query_tokens=self.num_query_tokens,
                prefix_hit_tokens=self.num_hit_tokens,
                pool_id=self.pool_id,
            )

    def report(self) -> list[LiveBlock]:
        """The pool as leak-report rows that add up to every page: each request's own pages,
        pages shared by several, cached, free and the zero page."""
        with self._lock:
            return pool_rows(self, list(self._seqs.values()))
