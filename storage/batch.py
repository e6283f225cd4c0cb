"""One batch of queued items → one transaction. Planning happens in memory (merge each logit probe
into its request's row when both are in hand); executing inserts the rows and puts the remaining
logit probes onto request rows stored by earlier batches. Re-running a plan after a failed
transaction is safe: the in-memory merge is idempotent and the transaction rolled back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import Connection, bindparam, insert, select, update

from storage.models import Base
from storage.rows import PROBE_STATUS, Row, merge_logit

REQUEST, PROBE, LOGIT = "request", "probe", "logit"
_IN_CHUNK = 500  # keeps IN (...) lists well inside every driver's parameter limit


@dataclass(frozen=True)
class Item:
    kind: str  # REQUEST | PROBE | LOGIT
    row: Row


@dataclass
class BatchPlan:
    inserts: list[Row] = field(default_factory=list)
    # request_id -> logit probe whose request row is not in this batch (stored before, or later)
    logits: dict[str, Row] = field(default_factory=dict)
    num_items: int = 0  # queue items (and consumed orphans) this plan settles


def plan_batch(items: Iterable[Item], orphans: dict[str, Row]) -> BatchPlan:
    """`orphans`: logit probes that arrived before their request row; consumed (popped) here."""
    plan = BatchPlan()
    requests: dict[str, Row] = {}
    for item in items:
        plan.num_items += 1
        rid = item.row["request_id"]
        if item.kind == REQUEST:
            plan.inserts.append(item.row)
            requests.setdefault(rid, item.row)
            early = orphans.pop(rid, None)
            if early is not None:
                plan.num_items += 1
                _attach(plan, item.row, early)
        elif item.kind == PROBE:
            plan.inserts.append(item.row)
        else:
            target = requests.get(rid)
            if target is not None:
                _attach(plan, target, item.row)
            elif rid in plan.logits:  # a second logit probe of one request: keep it as a probe row
                plan.inserts.append(item.row)
            else:
                plan.logits[rid] = item.row
    return plan


def _attach(plan: BatchPlan, request: Row, logit: Row) -> None:
    if request["op"] is None:
        merge_logit(request, logit)
    else:
        plan.inserts.append(logit)


def execute_plan(conn: Connection, plan: BatchPlan) -> dict[str, Row]:
    """Run the plan inside the caller's transaction; returns the logit probes with no stored
    request row yet (the caller keeps them as orphans)."""
    table = Base.metadata.tables["inference_log"]
    if plan.inserts:
        conn.execute(insert(table), plan.inserts)
    if not plan.logits:
        return {}
    found: set[str] = set()
    rids = list(plan.logits)
    for start in range(0, len(rids), _IN_CHUNK):
        chunk = rids[start : start + _IN_CHUNK]
        query = select(table.c.request_id).where(
            table.c.request_id.in_(chunk),
            table.c.status != PROBE_STATUS,
            table.c.op.is_(None),
        )
        found.update(conn.execute(query).scalars())
    if found:
        stmt = (
            update(table)
            .where(
                table.c.request_id == bindparam("b_request_id"),
                table.c.status != PROBE_STATUS,
                table.c.op.is_(None),
            )
            .values(
                op=bindparam("b_op"),
                output=bindparam("b_output"),
                expected=bindparam("b_exp"),
                tolerance=bindparam("b_tolerance"),
            )
        )
        params = [
            {
                "b_request_id": rid,
                "b_op": plan.logits[rid]["op"],
                "b_output": plan.logits[rid]["output"],
                "b_exp": plan.logits[rid]["expected"],
                "b_tolerance": plan.logits[rid].get("tolerance"),
            }
            for rid in sorted(found)
        ]
        conn.execute(stmt, params)
    return {rid: row for rid, row in plan.logits.items() if rid not in found}
