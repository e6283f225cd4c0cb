"""The page pool: fixed-size KV pages in one tensor, the prefix index over full pages, and the
page tables into it (`SequenceKV`, what the models read and write; kv_cache.py has the verbs).

    data[num_layers, 2, num_kv_heads, num_pages, page_size, head_dim]    (0 = keys, 1 = values)

Head-major: one kv head's page is one contiguous [page_size, head_dim] run, so a layer's pages
gathered head by head in page-table order are, per sequence and head, one contiguous
[tokens, head_dim] matrix: the layout attention kernels read fastest (measured against a
token-major page, whose gathered keys are strided per head: ~15% slower per layer on CPU).

Reserved at start, not grown (the decision DESIGN asks for): the pool is one allocator block of
`kv_cache_bytes` (rounded down to whole pages), taken when the engine is built and released when
it shuts down. Why: the batched attention gathers pages from one tensor per layer (a paged kernel
needs exactly that), and pages of a fixed size in one tensor cannot fragment. Memory stays flat:
the block's size never changes. On CUDA this reserves device memory up front (as vLLM does); on
CPU the OS backs a large block lazily, page by page as it is first written, and pages are handed
out lowest id first, so resident memory follows the peak number of pages in use, not the cap.

Page states: *free* (on a min-heap), *used* (held by >= 1 sequence: `refcounts[p] > 0`) and
*cached* (held by none but keyed in the prefix index; LRU order, evicted oldest first when no
free page is left, and on CPU before a page that was never written is touched). A page is zeroed
when it is handed out (fresh memory may hold NaN bit patterns, and a masked key still multiplies
its value by 0). Page 0 is the zero page: never handed out; padding in a batched gather points
at it. A keyed page is full and is never written again: only the unkeyed page at a sequence's
cursor is written, and it is held by that sequence alone.
"""

from __future__ import annotations

import hashlib
import heapq
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from runtime.memory.gather_scratch import GatherScratch

ZERO_PAGE = 0
MAX_CHILDREN_SCANNED = 32  # PagePool.best_child
TokenSlice = Callable[[int, int], Sequence[int]]  # (start, end) -> the sequence's token ids


def page_key(prev_key: bytes, token_ids: Sequence[int], model_version: str) -> bytes:
    """Key of a full page: its tokens, everything before it (through the previous key) and the
    weights that computed it. blake2b-128: collisions are out of reach, unlike Python's hash."""
    h = hashlib.blake2b(prev_key, digest_size=16)
    h.update(model_version.encode())
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def child_slot(prev_key: bytes, model_version: str) -> bytes:
    """What the pages following `prev_key` (b"": a sequence's first page) are indexed under
    for partial reuse: the previous key and the weights, as in their own keys."""
    return b"slot:" + prev_key + model_version.encode()


def salt_root(salt: str) -> bytes:
    """The key a salted sequence's first page chains from (an unsalted one chains from b""):
    pages computed under different salts (tenants, a request's `cache_salt`) never share a key,
    so one tenant can neither reuse nor detect another's cached prefix."""
    if not salt:
        return b""
    return hashlib.blake2b(salt.encode(), digest_size=16, person=b"fastllm-salt").digest()


class PagePool:
    """Pages, their reference counts, and the prefix index. Not thread-safe: KVCache locks."""

    def __init__(self, data: torch.Tensor) -> None:
        assert data.dim() == 6 and data.shape[1] == 2, "want [layers, 2, heads, pages, block, dim]"
        self.data = data
        self.num_pages = int(data.shape[3])  # including the zero page
        self.refcounts = [0] * self.num_pages
        self.num_shared = 0  # pages held by more than one sequence (a forked or reused prefix)
        self._free = list(range(1, self.num_pages))  # sorted: already a heap
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached pages, oldest first
        self._by_key: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        # keyed pages by what precedes them (`child_slot`), with their tokens, newest last: a
        # prompt that ends inside such a page reuses its first tokens (KVCache.allocate)
        self._children: dict[bytes, dict[int, tuple[int, ...]]] = {}
        self._slot_of: dict[int, bytes] = {}
        self.lazy = data.device.type == "cpu"  # memory becomes resident when first written
        self._touched = ZERO_PAGE + 1  # pages below this id have been written
        data[:, :, :, ZERO_PAGE].zero_()

    # --- counts --------------------------------------------------------------------------------
    @property
    def num_usable(self) -> int:
        return self.num_pages - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._lru)

    @property
    def num_used(self) -> int:
        return self.num_usable - self.num_free - self.num_cached

    def can_take(self, n: int) -> bool:
        return n <= len(self._free) + len(self._lru)

    # --- pages ---------------------------------------------------------------------------------
    def take(self, n: int) -> list[int] | None:
        """`n` zeroed pages held once each (free pages first, then the oldest cached ones), or
        None when there are not that many: no room is a return value, never a partial grant."""
        if not self.can_take(n):
            return None
        pages: list[int] = []
        free, lru = self._free, self._lru
        while len(pages) < n:
            # a free page whose memory was written before; on CPU an untouched one is not
            # resident yet, so a cached page is evicted first: resident memory then follows the
            # peak of pages in use, not an ever-growing cache (on CUDA the pool is reserved)
            if free and (free[0] < self._touched or not lru or not self.lazy):
                page = heapq.heappop(free)
                self._touched = max(self._touched, page + 1)
            else:  # evict: the page's old prefix is forgotten before it is reused
                page, _ = lru.popitem(last=False)
                self._forget(page)
            pages.append(page)
        for page in pages:
            self.refcounts[page] = 1
        if pages:
            index = torch.tensor(pages, device=self.data.device)
            self.data.index_fill_(3, index, 0)
        return pages

    def hold(self, page: int) -> None:
        """One more holder of a used or cached page (a prefix hit)."""
        if self.refcounts[page] == 0:
            del self._lru[page]  # KeyError for a free page: holding one is a bug
        self.refcounts[page] += 1
        if self.refcounts[page] == 2:
            self.num_shared += 1

    def release(self, page: int) -> None:
        count = self.refcounts[page] - 1
        if count < 0:
            raise ValueError(f"page {page} released more often than held")
        self.refcounts[page] = count
        if count == 1:
            self.num_shared -= 1
        if count == 0:
            if page in self._key_of:
                self._lru[page] = None  # newest end: evicted last
            else:
                heapq.heappush(self._free, page)

    # --- prefix index --------------------------------------------------------------------------
    def lookup(self, key: bytes) -> int | None:
        return self._by_key.get(key)

    def publish(self, page: int, key: bytes, slot: bytes = b"", tokens: Sequence[int] = ()) -> bool:
        """Key a full, held page so later sequences can reuse it; with `slot` (what precedes it,
        `child_slot`) and its `tokens`, a prompt ending inside it can reuse its first tokens.
        False when the key already names another page (two sequences computed the same
        prefix): the first one stays."""
        if key in self._by_key or page in self._key_of or self.refcounts[page] == 0:
            return False
        self._by_key[key] = page
        self._key_of[page] = key
        if slot:
            self._children.setdefault(slot, {})[page] = tuple(tokens)
            self._slot_of[page] = slot
        return True

    def _forget(self, page: int) -> None:
        """Drop a page from the prefix index (evicted, or dropped with the cache)."""
        del self._by_key[self._key_of.pop(page)]
        slot = self._slot_of.pop(page, None)
        if slot is not None:
            children = self._children[slot]
            del children[page]
            if not children:
                del self._children[slot]

    def best_child(self, slot: bytes, tokens: Sequence[int]) -> tuple[int, int] | None:
        """(page, n): of the keyed pages that follow `slot`, the one whose first n tokens are
        `tokens`' first n, n as large as possible and >= 1; None when none starts alike.
        Scans the newest `MAX_CHILDREN_SCANNED` only: a popular prefix (a shared system
        prompt) can have thousands of continuations, and admission must stay cheap."""
        children = self._children.get(slot)
        if not children or not tokens:
            return None
        best: tuple[int, int] | None = None
        for scanned, page in enumerate(reversed(children)):
            if scanned == MAX_CHILDREN_SCANNED:
                break
            stored = children[page]
            n, limit = 0, min(len(stored), len(tokens))
            while n < limit and stored[n] == tokens[n]:
                n += 1
            if n and (best is None or n > best[1]):
                best = (page, n)
        return best

    def is_keyed(self, page: int) -> bool:
        return page in self._key_of

    def key_of(self, page: int) -> bytes | None:
        return self._key_of.get(page)

    def cached_pages(self) -> list[int]:
        return list(self._lru)

    def free_pages(self) -> list[int]:
        return sorted(self._free)

    def drop_cached(self) -> int:
        """Forget every cached (unheld, keyed) page: they go back to the free heap. For when
        the pages' contents are lost elsewhere (a tensor-parallel worker restarted with an
        empty pool): a later prefix hit must not reuse them. Returns how many were dropped."""
        dropped = list(self._lru)
        for page in dropped:
            self._forget(page)
            heapq.heappush(self._free, page)
        self._lru.clear()
        return len(dropped)


@dataclass(frozen=True)
class PrefixProbe:
    """The cached prefix a sequence would start from, found without holding it."""

    num_tokens: int  # tokens of K/V already stored: whole pages, then part of one copied
    # of the pages it reads (the copy's source included), those no sequence holds now:
    # `num_available_pages` counts them as room, and holding them takes them out of it
    num_idle_pages: int
    num_held_pages: int  # whole pages shared, not taken (a partial page is a new page's copy)


class SequenceKV:
    def __init__(
        self, data: torch.Tensor, seq_id: str = "", scratch: GatherScratch | None = None
    ) -> None:
        self.data = data  # the pool: [num_layers, 2, kv_heads, num_pages, page_size, head_dim]
        self.page_size = int(data.shape[4])
        self.seq_id = seq_id
        self.page_ids: list[int] = []  # the page table
        self.num_tokens = 0  # tokens whose K/V are already stored
        self.keys: list[bytes] = []  # prefix keys of the first len(keys) pages (all full)
        self.num_cached_tokens = 0  # tokens found in the prefix cache when allocated
        self.salt_key = b""  # what the first page's key chains from (kv_pool.salt_root)
        self.born_s = time.monotonic()
        self.scratch = scratch  # the cache's gather buffer (runtime.models.batch_plan.attend)

    @classmethod
    def empty(
        cls,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        page_size: int = 16,
    ) -> SequenceKV:
        """A pool of its own outside any allocator, with pages for `capacity` tokens (warm-up,
        `fastllm doctor`, tests). Page 0 is the zero page, as in a real pool."""
        num_pages = 1 + -(-capacity // page_size)
        shape = (num_layers, 2, num_kv_heads, num_pages, page_size, head_dim)
        kv = cls(torch.zeros(shape, dtype=dtype, device=device))
        kv.page_ids = list(range(1, num_pages))
        return kv

    @property
    def capacity(self) -> int:
        return len(self.page_ids) * self.page_size

    def advance(self, n: int) -> None:
        if self.num_tokens + n > self.capacity:
            raise ValueError(f"KV overflow: {self.num_tokens} + {n} > capacity {self.capacity}")
        self.num_tokens += n
