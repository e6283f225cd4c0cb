"""The writer's spool: rows still queued when a shutdown's flush runs out of time are appended to a
local JSON-lines file instead of being dropped, and written at the next start, exactly once.

    spool = Spool(path)
    spool.append(items)            # at close, from the drain thread: one line per item, fsync'd
    for claimed in spool.claim():  # at start: files nobody else is replaying
        todo = unstored(engine, claimed.items)  # what the table does not hold yet
        ...write todo like queued items...; claimed.finish()

Exactly once: `claim()` renames the spool (under an flock, so a process spilling into it never
loses lines to the rename) to a claimed file that stays flock'ed while it is replayed, so two
processes sharing one spool never replay the same file at once; a claimed file whose replayer
died holds no lock and is taken up again. A replay that crashed after its rows were committed is
harmless: `unstored` skips every row the table already holds (request ids are unique).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Engine, make_url, select

from storage.batch import LOGIT, PROBE, REQUEST, BatchPlan, Item
from storage.models import Base
from storage.rows import LATER_COLUMNS, PROBE_STATUS, Row

log = logging.getLogger(__name__)
_IN_CHUNK = 500
_CLAIMED = ".claimed"


def default_spool_path(database_url: str) -> Path | None:
    """Beside a SQLite file; `var/` (as the default SQLite file) for a server database; none for
    an in-memory SQLite database (nothing outlives its process)."""
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite":
        return Path("var") / "inference_log.spool.jsonl"
    database = url.database or ""
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        return None
    return Path(database).expanduser().with_name(Path(database).name + ".spool.jsonl")


def weight(row: Row) -> int:
    """Queue items a row stands for: a request row carrying its merged logit probe is two."""
    return 2 if row["status"] != PROBE_STATUS and row["op"] is not None else 1


def plan_items(plan: BatchPlan) -> list[Item]:
    """A planned batch back as items (merged rows stay merged)."""
    items = [Item(PROBE if r["status"] == PROBE_STATUS else REQUEST, r) for r in plan.inserts]
    return items + [Item(LOGIT, r) for r in plan.logits.values()]


def _encode(item: Item) -> str:
    row = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in item.row.items()}
    return json.dumps({"kind": item.kind, "row": row}, separators=(",", ":"))  # ASCII-only


def _decode(line: str) -> Item:
    doc: dict[str, Any] = json.loads(line)
    row = dict(doc["row"])
    row["ts"] = datetime.fromisoformat(row["ts"])
    for column in LATER_COLUMNS:  # spilled by a release before the column: one executemany
        row.setdefault(column, None)  # needs the same keys in every row
    if doc["kind"] not in (REQUEST, PROBE, LOGIT):
        raise ValueError(f"unknown item kind {doc['kind']!r}")
    return Item(doc["kind"], row)


@dataclass
class Claimed:
    """One claimed spool file, flock'ed until `finish()` (or the process's end)."""

    path: Path
    handle: IO[str]
    items: list[Item] = field(default_factory=list)
    num_bad_lines: int = 0  # e.g. a last line cut short by a crash while spilling

    def finish(self) -> None:
        """Every item is written, dropped or spilled again: the file has done its job."""
        self.path.unlink(missing_ok=True)
        self.handle.close()

    def release(self) -> None:
        """Not replayed after all: leave the file for the next start."""
        self.handle.close()


class Spool:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")

    def append(self, items: Sequence[Item]) -> None:
        """Append and fsync; raises OSError when the file cannot be written."""
        if not items:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(_encode(item) + "\n" for item in items)
        with self._locked(), self.path.open("a", encoding="ascii") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())

    def claim(self) -> list[Claimed]:
        """The spool and every orphaned claimed file, each locked and read; [] when none."""
        if not self.path.parent.is_dir():
            return []
        with self._locked():
            if self.path.exists():
                os.replace(self.path, self._claimed_name(uuid.uuid4().hex))
        out = []
        for path in sorted(self.path.parent.glob(self.path.name + ".*" + _CLAIMED)):
            claimed = self._open_claimed(path)
            if claimed is not None:
                out.append(claimed)
        return out

    def _claimed_name(self, tag: str) -> Path:
        return self.path.with_name(f"{self.path.name}.{tag}{_CLAIMED}")

    def _open_claimed(self, path: Path) -> Claimed | None:
        try:
            handle = path.open(encoding="ascii", errors="replace")
        except FileNotFoundError:  # finished by another process meanwhile
            return None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another live process is replaying it
            handle.close()
            return None
        if os.fstat(handle.fileno()).st_nlink == 0:  # finished just before we locked it
            handle.close()
            return None
        claimed = Claimed(path, handle)
        for line in handle:
            try:
                claimed.items.append(_decode(line))
            except (ValueError, KeyError, TypeError):
                claimed.num_bad_lines += 1
        if claimed.num_bad_lines:
            log.warning("inference_log: %s: %d unreadable lines", path, claimed.num_bad_lines)
        return claimed

    def _locked(self) -> _FileLock:
        return _FileLock(self._lock_path)


class _FileLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[str] | None = None

    def __enter__(self) -> None:
        self._handle = self.path.open("a")
        fcntl.flock(self._handle.fileno(), fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        assert self._handle is not None
        self._handle.close()  # closing releases the flock


def unstored(engine: Engine, items: Sequence[Item]) -> list[Item]:
    """The items whose rows the table does not hold yet (a replay may run twice)."""
    table = Base.metadata.tables["inference_log"]
    rids = sorted({item.row["request_id"] for item in items})
    requests: set[str] = set()  # request ids with their request row stored
    probes: set[tuple[str, str]] = set()  # (request_id, op) of stored probe rows
    ops: set[tuple[str, str]] = set()  # (request_id, op) on any stored row
    with engine.connect() as conn:
        for start in range(0, len(rids), _IN_CHUNK):
            query = select(table.c.request_id, table.c.status, table.c.op).where(
                table.c.request_id.in_(rids[start : start + _IN_CHUNK])
            )
            for rid, status, op in conn.execute(query):
                if status == PROBE_STATUS:
                    probes.add((rid, op))
                else:
                    requests.add(rid)
                if op is not None:
                    ops.add((rid, op))
    out = []
    for item in items:
        rid, op = item.row["request_id"], item.row["op"]
        if item.kind == REQUEST:
            is_stored = rid in requests
        elif item.kind == PROBE:
            is_stored = (rid, op) in probes
        else:  # a logit probe lands on its request's row, or became a probe row of its own
            is_stored = (rid, op) in ops
        if not is_stored:
            out.append(item)
    return out
