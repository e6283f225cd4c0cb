"""inference_log writer throughput on SQLite and PostgreSQL, against a direct batched insert of
the same rows measured in the same run.

    python -m bench.storage [--quick] [--postgres-url URL | --no-postgres]

For each database: N request rows (10% verified, with a logit probe and four per-op probes) go
through `InferenceLogWriter.record()` in engine-sized groups; rows/s counts from the first
record() to the end of close() (everything committed). The reference is a plain synchronous
executemany of the same rows in the same batch size. PostgreSQL is a throwaway cluster started
from the server binaries (as the test fixture does) unless --postgres-url is given.
`verify_overhead_pct`: serving with verification at 1% vs off, same run (bench.verify_overhead:
the small llama, the serving bench's quick workload; read that module for what is measured);
--no-verify skips it, --threads N sets torch's CPU threads (use 1 on a shared CPU).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from sqlalchemy import Engine, delete, insert

from runtime.engine.stats import FinishReason, RequestStats, VerificationResult
from storage.db import make_engine, upgrade
from storage.models import InferenceLog
from storage.rows import probe_row, request_row
from storage.writer import InferenceLogWriter

PROBE_OPS = ("logit", "geglu", "rms_norm", "rotary", "attention")
GROUP = 16  # requests finished per engine step


def workload(n: int) -> list[tuple[list[RequestStats], list[VerificationResult]]]:
    now = time.time()
    groups = []
    for start in range(0, n, GROUP):
        finished, verified = [], []
        for i in range(start, min(n, start + GROUP)):
            finished.append(
                RequestStats(
                    f"req-{i}",
                    "tiny",
                    queued_ts=now - 1,
                    first_token_ts=now - 0.5,
                    finished_ts=now,
                    prompt_tokens=12,
                    completion_tokens=32,
                    finished_reason=FinishReason.STOP,
                    batch_size=8,
                )
            )
            if i % 10 == 0:
                verified += [
                    VerificationResult(f"req-{i}", "tiny", "stable", op, 1.0, 1.0, now)
                    for op in PROBE_OPS
                ]
        groups.append((finished, verified))
    return groups


def bench_writer(engine: Engine, groups, batch_size: int) -> tuple[float, int, float]:
    """(rows/s, rows written, mean record() cost per row in µs)."""
    writer = InferenceLogWriter(engine, queue_size=1 << 20, batch_size=batch_size, migrate=False)
    record_s = 0.0
    start = time.perf_counter()
    for finished, verified in groups:
        t0 = time.perf_counter()
        writer.record(finished=finished, verified=verified)
        record_s += time.perf_counter() - t0
    writer.close(timeout=600)
    elapsed = time.perf_counter() - start
    items = sum(len(f) + len(v) for f, v in groups)
    return writer.num_written / elapsed, writer.num_written, record_s / items * 1e6


def bench_direct(engine: Engine, groups, batch_size: int) -> float:
    rows = [request_row(s) for f, _ in groups for s in f]
    rows += [probe_row(v) for _, vs in groups for v in vs if v.op != "logit"]
    start = time.perf_counter()
    for i in range(0, len(rows), batch_size):
        with engine.begin() as conn:
            conn.execute(insert(InferenceLog), rows[i : i + batch_size])
    return len(rows) / (time.perf_counter() - start)


def bench_database(url: str, n: int, batch_size: int) -> dict[str, float]:
    engine = make_engine(url)
    upgrade(engine)
    groups = workload(n)
    direct = bench_direct(engine, groups, batch_size)
    with engine.begin() as conn:
        conn.execute(delete(InferenceLog))
    rows_per_s, written, record_us = bench_writer(engine, groups, batch_size)
    engine.dispose()
    return {
        "rows_per_s": rows_per_s,
        "direct_rows_per_s": direct,
        "rows": written,
        "record_us_per_item": record_us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rows (CI smoke run)")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--postgres-url", default=None, help="use this database instead")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-verify", action="store_true", help="skip verify_overhead_pct")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--device", default="auto", help="device of the verification run")
    args = parser.parse_args()
    n = args.requests or (2000 if args.quick else 20000)
    results: dict[str, dict[str, float] | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = bench_database(
            f"sqlite:///{Path(tmp) / 'bench.db'}", n, args.batch_size
        )
    results["postgres"] = None
    if args.postgres_url:
        results["postgres"] = bench_database(args.postgres_url, n, args.batch_size)
    elif not args.no_postgres:
        from tests.fixtures.pgcluster import PostgresCluster, find_bin_dir

        bin_dir = find_bin_dir()
        if bin_dir is None:
            print("postgres: server binaries not found; skipped (use --postgres-url)")
        else:
            with PostgresCluster(bin_dir) as cluster:
                url = cluster.url(cluster.create_database("bench"))
                results["postgres"] = bench_database(url, n, args.batch_size)
    for name, r in results.items():
        if r is not None:
            ratio = r["rows_per_s"] / r["direct_rows_per_s"]
            print(
                f"{name:9s} writer {r['rows_per_s']:9.0f} rows/s   direct insert "
                f"{r['direct_rows_per_s']:9.0f} rows/s   ratio {ratio:.2f}"
                f"   record() {r['record_us_per_item']:.1f} µs/item"
            )
    sqlite, pg = results["sqlite"], results["postgres"]
    summary = {
        "rows_per_s_sqlite": round(sqlite["rows_per_s"], 1) if sqlite else None,
        "rows_per_s_postgres": round(pg["rows_per_s"], 1) if pg else None,
        "writer_vs_direct_sqlite": round(sqlite["rows_per_s"] / sqlite["direct_rows_per_s"], 3)
        if sqlite
        else None,
        "writer_vs_direct_postgres": round(pg["rows_per_s"] / pg["direct_rows_per_s"], 3)
        if pg
        else None,
        "record_us_per_item_sqlite": round(sqlite["record_us_per_item"], 2) if sqlite else None,
        "requests": n,
        "verify_overhead_pct": None,
    }
    if not args.no_verify:
        import torch

        from bench.verify_overhead import measure

        if args.threads:
            torch.set_num_threads(args.threads)
        summary.update(measure(quick=args.quick, device=args.device))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
