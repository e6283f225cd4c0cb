"""Rich tables for `fastllm audit`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from storage.audit import AuditReport


def print_report(report: AuditReport, max_anomalies: int, console: Console | None = None) -> None:
    console = console or Console()
    ops = Table(title=f"verified ops (threshold {report.threshold:g})")
    for name in ("op", "verified", "anomalies", "max |output - expected|"):
        ops.add_column(name, justify="left" if name == "op" else "right")
    for s in report.per_op:
        style = "red" if s.num_anomalies else None
        worst = "-" if s.max_abs_error is None else f"{s.max_abs_error:.3g}"
        ops.add_row(s.op, str(s.num_verified), str(s.num_anomalies), worst, style=style)
    console.print(ops)
    if report.worst:
        rows = Table(title="worst rows")
        for name in ("ts", "request_id", "model", "op", "output", "expected", "abs error"):
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
                style="red" if r.is_anomaly else None,
            )
        console.print(rows)
    verdict = "FAIL" if report.num_anomalies > max_anomalies else "ok"
    console.print(
        f"{report.num_anomalies} anomalies (ABS(output - expected) > {report.threshold:g})"
        f"{f' for op {report.op}' if report.op else ''}; allowed {max_anomalies}: {verdict}"
    )
