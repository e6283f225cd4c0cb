"""The page pool in the allocator's leak report: rows whose pages add up to the whole pool.

Owners: a request id (the pages only it holds), `<owner>:shared` (pages several requests hold:
a shared prefix), `<owner>:cached` (held by none, kept for prefix reuse), `<owner>:free` and
`<owner>:zero-page`. A request that outlives its client shows up by name, as any leak does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import torch

from runtime.memory.kv_pool import ZERO_PAGE, PagePool
from runtime.memory.report import LiveBlock


class PoolView(Protocol):
    """What the report reads of a `KVCache` (a protocol: kv_cache imports this module)."""

    @property
    def pool(self) -> PagePool: ...
    @property
    def owner(self) -> str: ...
    @property
    def bytes_per_page(self) -> int: ...
    @property
    def tier(self) -> str: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def born_s(self) -> float: ...


class TableView(Protocol):
    """What the report reads of a `SequenceKV`."""

    @property
    def seq_id(self) -> str: ...
    @property
    def page_ids(self) -> Sequence[int]: ...
    @property
    def born_s(self) -> float: ...


def pool_rows(cache: PoolView, seqs: Sequence[TableView]) -> list[LiveBlock]:
    """Under the cache's lock."""
    pool, now = cache.pool, time.monotonic()
    layers, _, heads, _, block, dim = pool.data.shape

    def row(owner: str, num_pages: int, born_s: float) -> LiveBlock:
        return LiveBlock(
            owner=owner,
            nbytes=num_pages * cache.bytes_per_page,
            reserved_bytes=num_pages * cache.bytes_per_page,
            tier=cache.tier,
            age_s=now - born_s,
            shape=(layers, 2, heads, num_pages, block, dim),
            dtype=str(cache.dtype).removeprefix("torch."),
            num_handles=num_pages,
            is_released=False,
        )

    rows = []
    for kv in sorted(seqs, key=lambda s: s.born_s):  # oldest first, as the report is
        own = sum(1 for page in kv.page_ids if pool.refcounts[page] == 1)
        if own:
            rows.append(row(kv.seq_id, own, kv.born_s))
    num_shared = sum(1 for count in pool.refcounts if count > 1)
    born = cache.born_s
    for suffix, count in (
        ("shared", num_shared),
        ("cached", pool.num_cached),
        ("free", pool.num_free),
        ("zero-page", 1 if pool.refcounts[ZERO_PAGE] == 0 else 0),
    ):
        if count:
            rows.append(row(f"{cache.owner}:{suffix}", count, born))
    return rows
