"""Rich tables for `fastllm audit`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from storage.audit import AuditReport


def print_report(report: AuditReport, max_anomalies: int, console: Console | None = None) -> None:
    console = console or Console()
    ops = Table(title=f"verified ops ({_bound(report)}){_scope(report)}")
    for name in ("op", "verified", "anomalies", "max |output - expected|"):
        ops.add_column(name, justify="left" if name == "op" else "right")
    for s in report.per_op:
        style = "red" if s.num_anomalies else None
        worst = "-" if s.max_abs_error is None else f"{s.max_abs_error:.3g}"
        ops.add_row(s.op, str(s.num_verified), str(s.num_anomalies), worst, style=style)
    console.print(ops)
    if report.worst:
        rows = Table(title="worst rows")
        columns = ("ts", "request_id", "model", "op", "output", "expected", "abs error", "bound")
        for name in columns:
            rows.add_column(name)
        for r in report.worst:
            rows.add_row(
                r.ts.strftime("%Y-%m-%d %H:%M:%S"),
                r.request_id,
                f"{r.model}:{r.version}",
                r.op,
                f"{r.output:.6g}",
                f"{r.expected:.6g}",
                f"{r.abs_error:.3g}",
                f"{_row_bound(report, r.tolerance):.3g}",
                style="red" if r.is_anomaly else None,
            )
        console.print(rows)
    verdict = "FAIL" if report.num_anomalies > max_anomalies else "ok"
    console.print(
        f"{report.num_anomalies} anomalies (ABS(output - expected) > {_bound(report)})"
        f"{f' for op {report.op}' if report.op else ''}; allowed {max_anomalies}: {verdict}"
    )


def _bound(report: AuditReport) -> str:
    if report.per_row:
        return f"each row's recorded tolerance, {report.threshold:g} where none"
    return f"threshold {report.threshold:g}"


def _scope(report: AuditReport) -> str:
    models = ", ".join(report.models) if report.models else "every model"
    return f" of {models}" + (f" on {report.instance}" if report.instance else "")


def _row_bound(report: AuditReport, tolerance: float | None) -> float:
    return tolerance if report.per_row and tolerance is not None else report.threshold
