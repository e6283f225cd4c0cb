"""The operator-anomaly audit: the operations guide's query
`SELECT COUNT(*) FROM inference_log WHERE ABS(output - expected) > :threshold` (threshold always a
bound parameter), plus per-op counts and the worst recent rows, filtered by --since and --op.

Default thresholds are absolute errors per serving dtype (the reference path is always fp32):
fp32 1e-3; fp16 1e-2 (10-bit mantissa); bf16 5e-2 (7-bit mantissa). See docs/verification.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Connection, Engine, bindparam, case, func, select, text

from storage.models import Base, InferenceLog, UTCDateTime

if TYPE_CHECKING:
    from runtime.config import Settings

DEFAULT_THRESHOLDS: dict[str, float] = {"float32": 1e-3, "float16": 1e-2, "bfloat16": 5e-2}
AUDIT_QUERY = "SELECT COUNT(*) FROM inference_log WHERE ABS(output - expected) > :threshold"


# weight-only quantized linears run their kernels on bf16 activations (runtime.models.quant), so
# their production logits carry bf16-class rounding against the fp32 reference computed with the
# same dequantized weights; fp8 also rounds the activations to e4m3 (3 mantissa bits)
QUANTIZED_THRESHOLDS: dict[str, float] = {"int8": 5e-2, "int4": 5e-2, "fp8": 0.5}


def default_threshold(dtype: str, quantization: str | None = None) -> float:
    """Absolute-error threshold for a serving dtype ("float32" | "float16" | "bfloat16") and
    weight quantization (None/"none", "int8", "int4", "fp8"): the looser of the two."""
    threshold = DEFAULT_THRESHOLDS[dtype.removeprefix("torch.")]
    if quantization and quantization != "none":
        threshold = max(threshold, QUANTIZED_THRESHOLDS[quantization])
    return threshold


def anomaly_threshold(settings: Settings) -> float:
    """A server's threshold: `verify_threshold` when set, else the default for its dtype and
    quantization. One source for fastllm_operator_anomalies_total, the status page's audit and
    the canary rollout's anomaly rate."""
    if settings.verify_threshold is not None:
        return settings.verify_threshold
    return default_threshold(settings.dtype, settings.quantization)


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


@dataclass(frozen=True)
class AuditReport:
    threshold: float
    since: datetime | None
    op: str | None
    num_anomalies: int  # the guide's COUNT(*), with the since/op filters
    per_op: tuple[OpSummary, ...]
    worst: tuple[AuditRow, ...]  # largest ABS(output - expected) first

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["since"] = self.since.isoformat() if self.since else None
        for row in data["worst"]:
            row["ts"] = row["ts"].isoformat()
        return data


def count_anomalies(
    conn: Connection, threshold: float, *, since: datetime | None = None, op: str | None = None
) -> int:
    """The guide's query, verbatim, with optional `AND ts >= :since` / `AND op = :op`."""
    sql = AUDIT_QUERY
    params: dict[str, Any] = {"threshold": threshold}
    if since is not None:
        sql += " AND ts >= :since"
        params["since"] = since
    if op is not None:
        sql += " AND op = :op"
        params["op"] = op
    stmt = text(sql)
    if since is not None:
        # typed bind: goes through UTCDateTime (naive UTC on SQLite, timestamptz on PostgreSQL)
        stmt = stmt.bindparams(bindparam("since", type_=UTCDateTime()))
    return int(conn.execute(stmt, params).scalar_one())


def run_audit(
    engine: Engine,
    threshold: float,
    *,
    since: datetime | None = None,
    op: str | None = None,
    num_worst: int = 10,
) -> AuditReport:
    t = Base.metadata.tables["inference_log"].c
    abs_error = func.abs(t.output - t.expected)
    where: list[ColumnElement[bool]] = [
        t.op.is_not(None),
        t.output.is_not(None),
        t.expected.is_not(None),
    ]
    if since is not None:
        where.append(t.ts >= since)
    if op is not None:
        where.append(t.op == op)
    per_op_query = (
        select(
            t.op,
            func.count(),
            func.coalesce(func.sum(case((abs_error > threshold, 1), else_=0)), 0),
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
    with engine.connect() as conn:
        num_anomalies = count_anomalies(conn, threshold, since=since, op=op)
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
                is_anomaly=float(r.abs_error) > threshold,
            )
            for r in conn.execute(worst_query)
        )
    return AuditReport(threshold, since, op, num_anomalies, per_op, worst_rows)
