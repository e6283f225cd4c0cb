"""Stateful property test: random alloc / view / raw alias / release / drop across all three tiers.

The model tracks which Python objects the test still holds; a block's storage is alive iff a raw
alias is held, or an unreleased view is held, or its base is unreleased and the Block object is
still reachable (held directly or through a held view). Invariants after every step:
  - bytes_in_use == sum of reserved bytes of blocks whose storage is alive (per tier), same count
  - no two live blocks overlap in memory, and every live block still holds the value written at
    alloc (so nothing was handed out again while any view of it was alive)
  - hits + misses == allocations; releases and leaks match the model; small in_use + cached ==
    slab bytes + live direct allocations; medium cached <= cap
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import hypothesis.strategies as st
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runtime.engine.stats import TierStats
from runtime.errors import DoubleReleaseError, UseAfterReleaseError
from runtime.memory import Allocator, Block, BlockView
from tests.runtime.memory.conftest import TINY

TIERS = ("small", "medium", "large")
# float32 element counts: 1..255 small (< 1 KiB), 256..1024 medium, 1025.. large (> 4 KiB)
NUMELS = st.one_of(st.integers(1, 255), st.integers(256, 1024), st.integers(1025, 1600))


@dataclass
class Entry:
    block: Block | None  # None once the test dropped its reference
    tier: str
    reserved: int
    ptr: int
    value: float
    views: list[BlockView] = field(default_factory=list)  # held views, released or not
    raws: list[torch.Tensor] = field(default_factory=list)  # untracked aliases
    base_released: bool = False
    num_views_made: int = 0
    num_views_released: int = 0
    # a small-tier miss: served outside the slab (on the entry itself, not by id(): a settled
    # entry's id is reused by the next object, which then counted as direct whatever its tier)
    is_direct_small: bool = False

    @property
    def block_reachable(self) -> bool:
        return self.block is not None or bool(self.views)

    @property
    def alive(self) -> bool:
        return (
            bool(self.raws)
            or any(not v.is_released for v in self.views)
            or (self.block_reachable and not self.base_released)
        )

    @property
    def fully_released(self) -> bool:
        return self.base_released and self.num_views_released == self.num_views_made

    def any_tensor(self) -> torch.Tensor:
        if self.raws:
            return self.raws[0]
        for v in self.views:
            if not v.is_released:
                return v.tensor
        assert self.block is not None or self.views
        block = self.block if self.block is not None else self.views[0].block
        return block.tensor


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc = Allocator(TINY)
        self.slab_bytes = self._tier("small").bytes_cached
        self.entries: list[Entry] = []  # alive per the model
        self.values = itertools.count(1)
        self.num_allocs = dict.fromkeys(TIERS, 0)
        self.num_releases = dict.fromkeys(TIERS, 0)
        self.num_leaks = dict.fromkeys(TIERS, 0)

    def _tier(self, name: str) -> TierStats:
        return next(t for t in self.alloc.stats().tiers if t.tier == name)

    def _pick(self, i: int, pred: Callable[[Entry], bool] = lambda e: True) -> Entry | None:
        pool = [e for e in self.entries if pred(e)]
        return pool[i % len(pool)] if pool else None

    def _settle(self) -> None:
        """Move entries whose storage the model says is dead out of `entries`, counting leaks."""
        for e in [e for e in self.entries if not e.alive]:
            self.entries.remove(e)
            if not e.fully_released:
                self.num_leaks[e.tier] += 1

    def _count_release(self, e: Entry) -> None:
        if e.fully_released:
            self.num_releases[e.tier] += 1

    # --- rules ---------------------------------------------------------------------------------
    @rule(numel=NUMELS, owner=st.sampled_from(["req-a", "req-b", "kv"]))
    def alloc_block(self, numel: int, owner: str) -> None:
        misses_before = self._tier("small").misses
        block = self.alloc.alloc((numel,), torch.float32, owner=owner)
        value = float(next(self.values))
        block.tensor.fill_(value)
        e = Entry(block, block.tier, block.reserved_bytes, block.tensor.data_ptr(), value)
        assert e.tier == TINY.tier_of(numel * 4)
        if e.tier == "small" and self._tier("small").misses > misses_before:
            e.is_direct_small = True
        self.num_allocs[e.tier] += 1
        self.entries.append(e)

    @rule(i=st.integers(0, 10**6), data=st.data())
    def make_view(self, i: int, data: st.DataObject) -> None:
        e = self._pick(i, lambda e: e.block is not None and not e.base_released)
        if e is None or e.block is None:
            return
        n = e.block.tensor.numel()
        start = data.draw(st.integers(0, n - 1))
        e.views.append(e.block[start:])
        e.num_views_made += 1

    @rule(i=st.integers(0, 10**6))
    def take_raw_alias(self, i: int) -> None:
        e = self._pick(i, lambda e: e.block is not None and not e.base_released)
        if e is not None and e.block is not None:
            e.raws.append(e.block.tensor.view(-1)[:1])

    @rule(i=st.integers(0, 10**6))
    def release_base(self, i: int) -> None:
        e = self._pick(i, lambda e: e.block is not None)
        if e is None or e.block is None:
            return
        if e.base_released:
            try:
                e.block.release()
                raise AssertionError("double release not detected")
            except DoubleReleaseError:
                pass
            try:
                _ = e.block.tensor
                raise AssertionError("use after release not detected")
            except UseAfterReleaseError:
                pass
            return
        e.block.release()
        e.base_released = True
        self._count_release(e)
        self._settle()

    @rule(i=st.integers(0, 10**6), j=st.integers(0, 100))
    def release_view(self, i: int, j: int) -> None:
        e = self._pick(i, lambda e: bool(e.views))
        if e is None:
            return
        v = e.views[j % len(e.views)]
        if v.is_released:
            try:
                v.release()
                raise AssertionError("double release of a view not detected")
            except DoubleReleaseError:
                return
        v.release()
        e.num_views_released += 1
        self._count_release(e)
        self._settle()

    @rule(i=st.integers(0, 10**6))
    def drop_block(self, i: int) -> None:
        e = self._pick(i, lambda e: e.block is not None)
        if e is not None:
            e.block = None
            self._settle()

    @rule(i=st.integers(0, 10**6), j=st.integers(0, 100))
    def drop_view(self, i: int, j: int) -> None:
        e = self._pick(i, lambda e: bool(e.views))
        if e is not None:
            e.views.pop(j % len(e.views))
            self._settle()

    @rule(i=st.integers(0, 10**6))
    def drop_raw(self, i: int) -> None:
        e = self._pick(i, lambda e: bool(e.raws))
        if e is not None:
            e.raws.pop()
            self._settle()

    @precondition(lambda self: bool(self.entries))
    @rule()
    def release_everything_held(self) -> None:
        for e in list(self.entries):
            was_released = e.fully_released
            for v in e.views:
                if not v.is_released:
                    v.release()
                    e.num_views_released += 1
            if e.block is not None and not e.base_released:
                e.block.release()
                e.base_released = True
            if e.fully_released and not was_released:
                self.num_releases[e.tier] += 1
            e.raws.clear()
        self._settle()

    # --- invariants ----------------------------------------------------------------------------
    @invariant()
    def accounting_matches_the_model(self) -> None:
        stats = {t.tier: t for t in self.alloc.stats().tiers}
        for name in TIERS:
            live = [e for e in self.entries if e.tier == name]
            s = stats[name]
            assert s.bytes_in_use == sum(e.reserved for e in live), name
            assert s.live_blocks == len(live), name
            assert s.hits + s.misses == self.num_allocs[name], name
            assert s.releases == self.num_releases[name], name
            assert s.leaks == self.num_leaks[name], name
        direct = sum(e.reserved for e in self.entries if e.is_direct_small)
        small = stats["small"]
        assert small.bytes_in_use + small.bytes_cached == self.slab_bytes + direct
        assert stats["medium"].bytes_cached <= TINY.medium_cache_bytes
        assert stats["large"].bytes_cached == 0
        assert len(self.alloc.leak_report()) == len(self.entries)

    @invariant()
    def live_blocks_are_disjoint_and_intact(self) -> None:
        spans = sorted((e.ptr, e.ptr + e.reserved) for e in self.entries)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, "two live blocks share memory"
        for e in self.entries:
            assert float(e.any_tensor().view(-1)[0]) == e.value, "a live block was overwritten"

    def teardown(self) -> None:
        self.release_everything_held()
        for e in self.entries:
            e.block, e.views = None, []
        self._settle()
        assert not self.entries
        stats = self.alloc.stats()
        assert stats.bytes_in_use == 0 and stats.live_blocks == 0


AllocatorMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAllocatorMachine = AllocatorMachine.TestCase
