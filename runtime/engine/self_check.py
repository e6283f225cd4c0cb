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
a busy engine. Engines sharing one allocator (replicas, a canary or an embedding model on the
same device) see each other's blocks: every check registered on the allocator says which
requests its engine holds (`live_ids_of`), read before and after the report, so a block of any
of them, and any KV pool's own rows, are owned. A request that starts and ends inside one check
could still read as an orphan once (a line in the log; the gauge clears at the next check).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.memory import Allocator
    from runtime.memory.kv_cache import KVCache

log = logging.getLogger(__name__)

POOL_PREFIX = "kv-cache:"  # the KV pool's own rows in the leak report
# the checks of the engines that share one allocator, by id(allocator)
_SHARING: dict[int, weakref.WeakSet[IdleSelfCheck]] = {}


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


@dataclass(eq=False)  # identity semantics: checks are kept in a WeakSet per allocator
class IdleSelfCheck:
    kv: KVCache
    allocator: Allocator
    idle_s: float = 1.0  # idle this long before a check
    label: str = ""  # model/version, for the log line
    # the request ids this engine holds right now (read without its lock: a snapshot)
    live_ids_of: Callable[[], Collection[str]] | None = None
    last: SelfCheckResult | None = None
    _idle_since: float | None = field(default=None, repr=False)
    _steps_seen: int = field(default=-1, repr=False)
    _checked_this_idle: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        _SHARING.setdefault(id(self.allocator), weakref.WeakSet()).add(self)

    def _live_everywhere(self) -> set[str]:
        """Request ids live on any engine of this allocator (a snapshot of each)."""
        ids: set[str] = set()
        for check in list(_SHARING.get(id(self.allocator), ())):
            if check.live_ids_of is not None:
                ids.update(_snapshot(check.live_ids_of))
        return ids

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
        before = self._live_everywhere()
        blocks = self.allocator.leak_report()
        owned = set(live_ids) | before | self._live_everywhere()
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
            for b in blocks
            if b.owner not in kv_rows
            and not b.owner.startswith(POOL_PREFIX)  # a pool (this engine's or another's) rows
            and _request_of(b.owner) not in owned
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


def _snapshot(read: Callable[[], Collection[str]]) -> list[str]:
    """A copy of another thread's live ids; its dict may change while copied (then again)."""
    for _ in range(3):
        try:
            return list(read())
        except RuntimeError:  # "dictionary changed size during iteration"
            continue
    return []
