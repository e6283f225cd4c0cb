"""The allocator's books: per-tier counters, the live, pending and dropped slots, reclaiming
what became quiet, and the reports read from them.

`Allocator` (allocator.py, the hot paths that hand blocks out and take them back) inherits this;
the accounting rules are in allocator.py's docstring. Every method here that touches the books
takes `_lock`, or says it runs under it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from runtime.memory.config import LARGE, MEDIUM, SMALL, AllocatorConfig
from runtime.memory.report import LeakEvent, LiveBlock, leak_event, live_blocks
from runtime.memory.slot import Slot, TierCounters
from runtime.memory.stats import AllocatorStats
from runtime.memory.tiers import MediumCache, SmallSlabs, drop_memory, is_quiet, return_to_os

if TYPE_CHECKING:
    from runtime.memory.block import Block

log = logging.getLogger("runtime.memory.allocator")  # the name operators filter the leak lines by


class AllocatorLedger:
    def __init__(
        self, config: AllocatorConfig | None = None, device: torch.device | str = "cpu"
    ) -> None:
        self.config = config = config or AllocatorConfig()
        self.device = torch.device(device)
        self._lock = threading.Lock()
        self._counters = {t: TierCounters(t) for t in (SMALL, MEDIUM, LARGE)}
        self._c_small, self._c_medium, self._c_large = self._counters.values()
        self._small = SmallSlabs(config, self.device, self._c_small)
        self._c_small.bytes_cached = self._small.total_bytes
        self._medium = MediumCache(config.medium_cache_bytes, config.medium_class_bytes)
        self._live: set[Slot] = set()  # slots handed out and not yet reclaimed
        self._pending: list[Slot] = []  # every handle gone, an alias still alive
        self._dropped: deque[Slot] = deque()  # a handle was dropped unreleased (from __del__)
        self._recent_leaks: deque[LeakEvent] = deque(maxlen=256)
        # blocks a sub-allocator carves up (the KV page pool): reported as its rows, not as one
        self._breakdowns: dict[Slot, Callable[[], list[LiveBlock]]] = {}

    # --- reclaiming ------------------------------------------------------------------------------
    def _reclaim(self, slot: Slot) -> bool:
        """Under the lock: a quiet slot's memory goes back to its tier (or is freed); True when
        large memory was freed and should go back to the OS / driver."""
        c = slot.counters
        self._live.discard(slot)
        self._breakdowns.pop(slot, None)
        c.bytes_in_use -= slot.reserved
        c.live_blocks -= 1
        if slot.is_leaked:
            c.leaks += 1
            event = leak_event(slot)
            self._recent_leaks.append(event)
            log.warning("allocator leak reclaimed: %s", event)
        if slot.home is not None:
            slot.home.append(slot)
            c.bytes_cached += slot.reserved
        elif not slot.is_direct:
            c.evictions += self._medium.put(slot)
            c.bytes_cached = self._medium.cached_bytes
        else:
            drop_memory(slot)
            return slot.tier is LARGE and self.config.return_large_to_os
        return False

    def _collect_locked(self) -> bool:
        """Count dropped handles, then reclaim every pending slot that is quiet by now."""
        give_large_back = False
        dropped, pending = self._dropped, self._pending
        while dropped:
            slot = dropped.popleft()
            slot.num_handles -= 1
            slot.is_leaked = True
            if slot.num_handles == 0:
                pending.append(slot)
        if pending:
            still: list[Slot] = []
            for slot in pending:
                if is_quiet(slot):
                    give_large_back |= self._reclaim(slot)
                else:
                    still.append(slot)
            pending[:] = still
        return give_large_back

    def collect(self) -> None:
        """Reclaim what dropped handles and dead aliases left behind."""
        with self._lock:
            give_large_back = self._collect_locked()
        if give_large_back:
            return_to_os(self.device)

    # --- reports ---------------------------------------------------------------------------------
    def stats(self) -> AllocatorStats:
        self.collect()
        with self._lock:
            tiers = tuple(c.snapshot() for c in self._counters.values())
        return AllocatorStats(device=str(self.device), tiers=tiers)

    def set_breakdown(self, block: Block, rows: Callable[[], list[LiveBlock]]) -> None:
        """Report `block` as the rows `rows()` returns (whose bytes add up to the block's), e.g.
        the KV pool's pages per request, cached and free; until the block is released."""
        with self._lock:
            self._breakdowns[block._rec] = rows

    def leak_report(self) -> list[LiveBlock]:
        """Every block whose memory is not back in its tier, oldest first, with its owner; a
        block with a breakdown (set_breakdown) appears as its rows instead."""
        self.collect()
        with self._lock:  # slots are reused: read them while no handout can change them
            split = [fn for slot, fn in self._breakdowns.items() if slot in self._live]
            out = live_blocks(s for s in self._live if s not in self._breakdowns)
        # outside the lock: a breakdown takes its owner's lock, which may be held while it
        # allocates from this allocator
        for rows in split:
            out.extend(rows())
        return out

    def recent_leaks(self) -> list[LeakEvent]:
        """Blocks reclaimed while a handle had been dropped unreleased (the last 256)."""
        self.collect()
        with self._lock:
            return list(self._recent_leaks)
