"""Row isolation: a batch the database refused for a reason other than its availability (text it
cannot encode, a value out of a column's range) is written again one row per transaction, so the
rows that can be stored are, and only the refused ones are dropped: counted (reason "unstorable")
and logged with their request id.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

from storage.batch import BatchPlan
from storage.rows import Row
from storage.spool import plan_items, weight

if TYPE_CHECKING:
    from storage.drain_ports import DrainerPort

log = logging.getLogger("storage.drain")
UNSTORABLE = "unstorable"


def write_one_by_one(
    drainer: DrainerPort, plan: BatchPlan, cause: BaseException
) -> tuple[int, dict[str, Row]]:
    """Write `plan` row by row; returns (rows inserted, logit probes whose request row is not
    stored yet). Refused rows are counted dropped; if a shutdown's deadline passes meanwhile the
    rest is spilled. The caller settles the plan as if it had been written whole."""
    log.warning(
        "inference_log: a batch of %d rows was refused (%s); writing it row by row",
        len(plan.inserts) + len(plan.logits),
        _one_line(cause),
    )
    num_written = 0
    leftovers: dict[str, Row] = {}
    singles = [BatchPlan(inserts=[row], num_items=weight(row)) for row in plan.inserts]
    singles += [BatchPlan(logits={rid: row}, num_items=1) for rid, row in plan.logits.items()]
    for single in singles:
        if drainer.is_past_deadline:
            drainer.writer.spill(plan_items(single))
            continue
        try:
            leftovers.update(drainer._retry(partial(drainer._transaction, single)))
        except Exception as exc:
            if drainer.is_past_deadline:  # the database went away and the shutdown came
                drainer.writer.spill(plan_items(single))
                continue
            (row,) = single.inserts or list(single.logits.values())
            log.error(
                "inference_log: dropping the row of request %r (%s): %s",
                row["request_id"],
                row["status"],
                _one_line(exc),
            )
            drainer.writer.count_dropped(single.num_items, UNSTORABLE)
            continue
        num_written += len(single.inserts)
    return num_written, leftovers


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
