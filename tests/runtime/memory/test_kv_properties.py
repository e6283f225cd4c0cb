"""Stateful property test of the paged KV cache: random allocate (prompts drawn from a few shared
prefixes, so prefixes hit), grow-and-write (what a forward does), free, and recompute-after-
preemption, on a pool small enough that pages run out and cached pages are evicted.

Invariants after every step:
  - reference counts are never negative and equal the number of page tables holding the page;
  - no page is writable by two sequences: the pages at and after a sequence's cursor are held by
    it alone and are not keyed (a keyed page is full and never written again);
  - a keyed (cached or shared) page's contents never change while it stays keyed;
  - free + cached + used == all pages, and the allocator's leak report accounts for every page;
  - after draining every sequence, every page is free or cached.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runtime.memory import Allocator
from runtime.memory.kv_cache import KVCache
from tests.runtime.memory.conftest import TINY

BLOCK, NUM_PAGES = 2, 12
PREFIXES = ([1, 2, 3, 4, 5, 6], [1, 2, 3, 9], [7, 7, 7, 7, 7])
PROMPTS = st.builds(
    lambda prefix, cut, tail: PREFIXES[prefix][:cut] + tail,
    st.integers(0, len(PREFIXES) - 1),
    st.integers(0, 6),
    st.lists(st.integers(1, 9), min_size=1, max_size=4),
)


class PagedKV(RuleBasedStateMachine):
    device = "cpu"  # the CUDA variant (test_paged_cuda.py) puts the pool in device memory

    def __init__(self) -> None:
        super().__init__()
        self.cache = KVCache(
            num_layers=1,
            num_kv_heads=1,
            head_dim=1,
            dtype=torch.float32,
            device=self.device,
            allocator=Allocator(TINY, device=self.device),
            max_bytes=(NUM_PAGES + 1) * BLOCK * 8,  # 8 bytes a token (K and V, one float each)
            page_size=BLOCK,
        )
        self.tokens: dict[str, list[int]] = {}  # the sequence's known tokens (prompt + outputs)
        # keyed page -> (its key, its contents when it was keyed)
        self.snapshots: dict[int, tuple[bytes, torch.Tensor]] = {}
        self.next_id = 0

    # --- rules ---------------------------------------------------------------------------------
    @rule(prompt=PROMPTS)
    def allocate(self, prompt: list[int]) -> None:
        seq_id = f"s{self.next_id}"
        self.next_id += 1
        kv = self.cache.allocate(seq_id, prompt)
        assert kv.num_tokens == kv.num_cached_tokens <= len(prompt) - 1
        self.tokens[seq_id] = list(prompt)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), n=st.integers(1, 5))
    def compute(self, data: st.DataObject, n: int) -> None:
        """A forward over up to `n` pending tokens (the last one may sample a new token)."""
        seq_id = data.draw(st.sampled_from(sorted(self.tokens)))
        kv, tokens = self.cache.get(seq_id), self.tokens[seq_id]
        assert kv is not None
        n = min(n, len(tokens) - kv.num_tokens) or 1
        if kv.num_tokens + n > len(tokens):
            tokens.append(data.draw(st.integers(1, 9)))  # a sampled token joins the sequence
        if not self.cache.ensure(kv, n):
            return  # no room: nothing was taken (the scheduler would preempt)
        pool = self.cache.pool
        for pos in range(kv.num_tokens, kv.num_tokens + n):
            page = kv.page_ids[pos // BLOCK]
            assert pool.refcounts[page] == 1 and not pool.is_keyed(page), "shared write"
            kv.data[0, :, :, page, pos % BLOCK] = float(tokens[pos] * 100 + pos)
        kv.advance(n)
        self.cache.cache_full_pages(kv, lambda a, b: tokens[a:b])

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), recompute=st.booleans())
    def free(self, data: st.DataObject, recompute: bool) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.tokens)))
        self.cache.free(seq_id)
        tokens = self.tokens.pop(seq_id)
        if recompute:  # preempted: back later with prompt + outputs, from its cached prefix
            self.cache.allocate(seq_id, tokens)
            self.tokens[seq_id] = tokens

    # --- invariants ----------------------------------------------------------------------------
    @invariant()
    def refcounts_match_the_page_tables(self) -> None:
        pool = self.cache.pool
        held = [0] * pool.num_pages
        for seq_id in self.tokens:
            kv = self.cache.get(seq_id)
            assert kv is not None
            for page in kv.page_ids:
                held[page] += 1
        assert min(pool.refcounts) >= 0
        assert pool.refcounts == held

    @invariant()
    def keyed_pages_never_change(self) -> None:
        pool = self.cache.pool
        for page in range(1, pool.num_pages):
            key = pool.key_of(page)
            if key is None:
                self.snapshots.pop(page, None)  # evicted (or never keyed): it may be written
                continue
            now = pool.data[:, :, :, page].clone()
            before_key, before = self.snapshots.setdefault(page, (key, now))
            if before_key != key:  # evicted and keyed again within one step: a new prefix
                self.snapshots[page] = (key, now)
            else:
                assert torch.equal(before, now), f"cached page {page} was written"

    @invariant()
    def every_page_is_accounted_for(self) -> None:
        pool, stats = self.cache.pool, self.cache.stats()
        assert stats.num_free_pages + stats.num_cached_pages + stats.num_used_pages == NUM_PAGES
        assert stats.num_used_pages == sum(1 for c in pool.refcounts if c > 0)
        report = self.cache.allocator.leak_report()
        assert sum(b.num_handles for b in report) == NUM_PAGES + 1  # + the zero page
        assert sum(b.nbytes for b in report) == (NUM_PAGES + 1) * self.cache.bytes_per_page

    def teardown(self) -> None:
        for seq_id in list(self.tokens):
            self.cache.free(seq_id)
        stats = self.cache.stats()
        assert stats.num_used_pages == 0
        assert stats.num_free_pages + stats.num_cached_pages == NUM_PAGES
        owners = {b.owner for b in self.cache.allocator.leak_report()}
        assert owners <= {"kv-cache:free", "kv-cache:cached", "kv-cache:zero-page"}


PagedKV.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPagedKV = PagedKV.TestCase
