"""The operator-anomaly audit: the operations guide's query
`SELECT COUNT(*) FROM inference_log WHERE ABS(output - expected) > :threshold` (threshold always a
bound parameter), plus per-op counts and the worst recent rows, filtered by --since and --op.

Each verified row records the tolerance it was checked against (`inference_log.tolerance`,
runtime.verify.tolerance: a logit's grows with its magnitude and its dtype's spacing there), and
`per_row=True` counts each row against its own (`ABS(output - expected) > COALESCE(tolerance,
:threshold)`, the threshold for rows written before the column). `models` / `instance` keep the
audit to one server's rows when several share the database (the default SQLite file).

Default thresholds (the base of every tolerance) are absolute errors per serving dtype (the
reference path is always fp32): fp32 1e-3; fp16 1e-2 (10-bit mantissa); bf16 5e-2 (7-bit
mantissa). See docs/verification.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, bindparam, case, func, select, text

from runtime.verify.tolerance import (
    DEFAULT_THRESHOLDS,
    QUANTIZED_THRESHOLDS,
    anomaly_threshold,
    default_threshold,
)
from storage.models import Base, InferenceLog, UTCDateTime

__all__ = [
    "AUDIT_QUERY",
    "AUDIT_QUERY_PER_ROW",
    "DEFAULT_THRESHOLDS",
    "QUANTIZED_THRESHOLDS",
    "AuditReport",
    "AuditRow",
    "OpSummary",
    "anomaly_threshold",
    "count_anomalies",
    "default_threshold",
    "run_audit",
]

AUDIT_QUERY = "SELECT COUNT(*) FROM inference_log WHERE ABS(output - expected) > :threshold"
AUDIT_QUERY_PER_ROW = (
    "SELECT COUNT(*) FROM inference_log "
    "WHERE ABS(output - expected) > COALESCE(tolerance, :threshold)"
)


@dataclass(frozen=True)
class OpSummary:
    op: str
    num_verified: int  # rows of this op with output and expected
    num_anomalies: int  # of which ABS(output - expected) > threshold
    max_abs_error: float | None


@dataclass(frozen=True)
class AuditRow:
    id: int
    ts: datetime
    request_id: str
    model: str
    version: str
    status: str
    op: str
    output: float
    expected: float
    abs_error: float
    is_anomaly: bool
    tolerance: float | None = None  # what the row was checked against when recorded
    instance: str | None = None


@dataclass(frozen=True)
class AuditReport:
    threshold: float
    since: datetime | None
    op: str | None
    num_anomalies: int  # the guide's COUNT(*), with the since/op filters
    per_op: tuple[OpSummary, ...]
    worst: tuple[AuditRow, ...]  # largest ABS(output - expected) first
    per_row: bool = False  # each row against its recorded tolerance (threshold: where none)
    models: tuple[str, ...] = ()  # only these models' rows (empty: every model)
    instance: str | None = None  # only this server's rows (None: every server)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["since"] = self.since.isoformat() if self.since else None
        for row in data["worst"]:
            row["ts"] = row["ts"].isoformat()
        return data


def count_anomalies(
    conn: Connection,
    threshold: float,
    *,
    since: datetime | None = None,
    op: str | None = None,
    per_row: bool = False,
    models: Sequence[str] = (),
    instance: str | None = None,
) -> int:
    """The guide's query, verbatim (or its per-row form), with optional `AND ts >= :since`,
    `AND op = :op`, `AND model IN :models`, `AND instance = :instance`."""
    sql = AUDIT_QUERY_PER_ROW if per_row else AUDIT_QUERY
    params: dict[str, Any] = {"threshold": threshold}
    if since is not None:
        sql += " AND ts >= :since"
        params["since"] = since
    if op is not None:
        sql += " AND op = :op"
        params["op"] = op
    if models:
        sql += " AND model IN :models"
        params["models"] = list(models)
    if instance is not None:
        sql += " AND instance = :instance"
        params["instance"] = instance
    stmt = text(sql)
    if since is not None:
        # typed bind: goes through UTCDateTime (naive UTC on SQLite, timestamptz on PostgreSQL)
        stmt = stmt.bindparams(bindparam("since", type_=UTCDateTime()))
    if models:
        stmt = stmt.bindparams(bindparam("models", expanding=True))
    return int(conn.execute(stmt, params).scalar_one())


def run_audit(
    engine: Engine,
    threshold: float,
    *,
    since: datetime | None = None,
    op: str | None = None,
    num_worst: int = 10,
    per_row: bool = False,
    models: Sequence[str] = (),
    instance: str | None = None,
) -> AuditReport:
    t = Base.metadata.tables["inference_log"].c
    abs_error = func.abs(t.output - t.expected)
    bound = func.coalesce(t.tolerance, threshold) if per_row else threshold
    where: list[ColumnElement[bool]] = [
        t.op.is_not(None),
        t.output.is_not(None),
        t.expected.is_not(None),
    ]
    if since is not None:
        where.append(t.ts >= since)
    if op is not None:
        where.append(t.op == op)
    if models:
        where.append(t.model.in_(list(models)))
    if instance is not None:
        where.append(t.instance == instance)
    per_op_query = (
        select(
            t.op,
            func.count(),
            func.coalesce(func.sum(case((abs_error > bound, 1), else_=0)), 0),
            func.max(abs_error),
        )
        .where(*where)
        .group_by(t.op)
        .order_by(t.op)
    )
    worst_query = (
        select(InferenceLog, abs_error.label("abs_error"))
        .where(*where)
        .order_by(abs_error.desc(), t.ts.desc())
        .limit(num_worst)
    )
    scope: dict[str, Any] = {"per_row": per_row, "models": tuple(models), "instance": instance}
    with engine.connect() as conn:
        num_anomalies = count_anomalies(conn, threshold, since=since, op=op, **scope)
        per_op = tuple(
            OpSummary(str(name), int(n), int(bad), None if worst is None else float(worst))
            for name, n, bad, worst in conn.execute(per_op_query)
        )
        worst_rows = tuple(
            AuditRow(
                id=r.id,
                ts=r.ts,
                request_id=r.request_id,
                model=r.model,
                version=r.version,
                status=r.status,
                op=r.op,
                output=r.output,
                expected=r.expected,
                abs_error=float(r.abs_error),
                is_anomaly=float(r.abs_error) > _bound(r.tolerance, threshold, per_row),
                tolerance=r.tolerance,
                instance=r.instance,
            )
            for r in conn.execute(worst_query)
        )
    return AuditReport(threshold, since, op, num_anomalies, per_op, worst_rows, **scope)


def _bound(tolerance: float | None, threshold: float, per_row: bool) -> float:
    return tolerance if per_row and tolerance is not None else threshold
