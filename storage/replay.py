"""At start, before any new row: the rows a previous shutdown spilled (storage.spool) go through
the drain thread's normal path (batches, retries, row isolation), minus those the table already
holds. A claimed file is deleted once each of its rows is written, dropped or spilled again; a
file that cannot be replayed yet (the database still unreachable at the next shutdown) stays."""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

from storage.spool import unstored

if TYPE_CHECKING:
    from storage.drain_ports import DrainerPort

log = logging.getLogger("storage.drain")


def replay_spool(drainer: DrainerPort) -> None:
    writer = drainer.writer
    spool = writer.spool
    if spool is None:
        return
    try:
        claimed_files = spool.claim()
    except OSError as exc:
        log.error("inference_log: cannot read the spool %s: %s", spool.path, exc)
        return
    for claimed in claimed_files:
        try:
            todo = drainer._retry(partial(unstored, writer.engine, claimed.items))
        except Exception as exc:  # still unreachable when the shutdown came: next start
            log.error("inference_log: cannot replay %s yet: %s", claimed.path, exc)
            claimed.release()
            continue
        writer.accept_replayed(len(todo))
        for start in range(0, len(todo), writer.batch_size):
            drainer._write_items(todo[start : start + writer.batch_size])
        claimed.finish()
        log.info(
            "inference_log: replayed the spool %s: %d rows to write, %d already stored",
            claimed.path.name,
            len(todo),
            len(claimed.items) - len(todo),
        )
