"""The idle self-check of the KV pool and the allocator (as SGLang checks its pools when idle).

When the engine has had no live sequence for `idle_s`, two invariants must hold:
- every KV page is free or cached: a page still held (refcount > 0) is leaked, and the sequences
  still holding pages in the cache are its owners;
- every live allocator block has an owner that still exists: the KV pool itself (owners
  `kv-cache:...`) or a live request of this engine. A block owned by a request that has finished
  (`req-1`, `debug-leak:req-1`) is an orphan.
A breach is logged once per change with the owners, kept as `last` (the status page and the
`fastllm_kv_leaked_pages` / `fastllm_allocator_orphan_blocks` gauges read it) and alerted on.
Once per idle period: the check reads the whole leak report, so it never runs between steps of
a busy engine. One caveat: engines sharing one allocator (replicas, a canary on the same device)
each see the others' request blocks; the check then counts only blocks of owners shaped like
this engine's request ids that no engine of the set holds (`live_ids` should be their union).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.memory import Allocator
    from runtime.memory.kv_cache import KVCache

log = logging.getLogger(__name__)

POOL_PREFIX = "kv-cache:"  # the KV pool's own rows in the leak report


@dataclass(frozen=True)
class SelfCheckResult:
    checked_ts: float  # time.monotonic() of the check
    leaked_pages: int  # KV pages held while no sequence is live
    orphan_blocks: int  # live allocator blocks whose owner no longer exists
    page_owners: tuple[str, ...] = ()  # who still holds the leaked pages
    orphan_owners: tuple[str, ...] = ()  # owners of the orphan blocks
    num_checks: int = 0  # checks run so far (this one included)

    @property
    def is_clean(self) -> bool:
        return self.leaked_pages == 0 and self.orphan_blocks == 0


@dataclass
class IdleSelfCheck:
    kv: KVCache
    allocator: Allocator
    idle_s: float = 1.0  # idle this long before a check
    label: str = ""  # model/version, for the log line
    last: SelfCheckResult | None = None
    _idle_since: float | None = field(default=None, repr=False)
    _steps_seen: int = field(default=-1, repr=False)
    _checked_this_idle: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def on_idle(self, now: float, num_steps: int, live_ids: Collection[str]) -> None:
        """Called by the engine loop while it has nothing to schedule (under its lock)."""
        if num_steps != self._steps_seen:  # it worked since: a new idle period starts now
            self._steps_seen, self._idle_since, self._checked_this_idle = num_steps, now, False
            return
        assert self._idle_since is not None
        if self._checked_this_idle or live_ids or now - self._idle_since < self.idle_s:
            return
        self._checked_this_idle = True
        self.check(now, live_ids)

    def check(self, now: float, live_ids: Collection[str] = ()) -> SelfCheckResult:
        stats, rows = self.kv.stats(), self.kv.report()
        kv_rows = {r.owner for r in rows}
        # a request's own pages are a row of its id; pages several hold are one `:shared` row
        holders = tuple(
            sorted(
                r.owner
                for r in rows
                if not r.owner.startswith(POOL_PREFIX) or r.owner.endswith(":shared")
            )
        )
        orphans = [
            b.owner
            for b in self.allocator.leak_report()
            if b.owner not in kv_rows and _request_of(b.owner) not in live_ids
        ]
        leaked = 0 if live_ids else stats.num_used_pages
        with self._lock:
            num = (self.last.num_checks if self.last else 0) + 1
            result = SelfCheckResult(
                now, leaked, len(orphans), holders if leaked else (), tuple(orphans), num
            )
            changed = self.last is None or (
                (self.last.leaked_pages, self.last.orphan_blocks)
                != (result.leaked_pages, result.orphan_blocks)
            )
            self.last = result
        if not result.is_clean and changed:
            log.warning(
                "self-check %s: %d KV pages held while idle (holders: %s); %d allocator blocks "
                "whose owner is gone (owners: %s)",
                self.label,
                result.leaked_pages,
                ", ".join(result.page_owners) or "-",
                result.orphan_blocks,
                ", ".join(sorted(set(result.orphan_owners))) or "-",
            )
        elif result.is_clean and changed and num > 1:
            log.info("self-check %s: clean again", self.label)
        return result


def _request_of(owner: str) -> str:
    """`debug-leak:req-1` -> `req-1`; a KV pool's own owner is kept whole."""
    if owner.startswith(POOL_PREFIX):
        return owner
    return owner.rsplit(":", 1)[-1]
