from __future__ import annotations

import json
import math
import random
from datetime import datetime, timedelta, timezone

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text

from runtime.cli import cli, main
from storage.audit import AUDIT_QUERY, count_anomalies, default_threshold, run_audit
from storage.writer import InferenceLogWriter
from tests.storage.factories import PER_OP_PROBES, probe, request_stats

HOUR = 3600.0


def populate(engine: Engine, seed: int = 0) -> list[tuple[str, float, float, float]]:
    """Requests with logit + per-op probes; some geglu outputs corrupted, some rows 3 hours old.
    Returns (op, output, expected, ts) of every probe written."""
    rng = random.Random(seed)
    now = datetime.now(timezone.utc).timestamp()
    written = []
    with InferenceLogWriter(engine, migrate=False, batch_size=64) as writer:
        for i in range(200):
            ts = now - (3 * HOUR if i % 4 == 0 else 1.0)
            probes = []
            for op in ("logit", *PER_OP_PROBES):
                expected = rng.uniform(-5, 5)
                output = expected + rng.uniform(-1e-4, 1e-4)
                if op == "geglu" and rng.random() < 0.2:
                    output = rng.uniform(-50, 50)  # a broken kernel's random value
                probes.append(probe(i, op, output, expected, now=ts))
                written.append((op, output, expected, ts))
            writer.record(finished=[request_stats(i, now=ts)], verified=probes)
    return written


def expected_count(written, threshold, *, since_ts=None, op=None) -> int:
    return sum(
        1
        for o, out, exp, ts in written
        if abs(out - exp) > threshold and (since_ts is None or ts >= since_ts) and op in (None, o)
    )


def test_guide_query_runs_verbatim(engine: Engine) -> None:
    written = populate(engine)
    with engine.connect() as conn:
        n = conn.execute(
            text("SELECT COUNT(*) FROM inference_log WHERE ABS(output - expected) > 0.001")
        ).scalar_one()
        bound = conn.execute(text(AUDIT_QUERY), {"threshold": 0.001}).scalar_one()
    assert n == bound == expected_count(written, 0.001) > 0


def test_filters_and_per_op_counts(engine: Engine) -> None:
    written = populate(engine)
    since = datetime.now(timezone.utc) - timedelta(hours=1)
    with engine.connect() as conn:
        assert count_anomalies(conn, 1e-3, since=since) == expected_count(
            written, 1e-3, since_ts=since.timestamp()
        )
        assert count_anomalies(conn, 1e-3, op="rms_norm") == 0
    report = run_audit(engine, 1e-3, since=since, num_worst=5)
    by_op = {s.op: s for s in report.per_op}
    assert set(by_op) == {"logit", *PER_OP_PROBES}
    for op, summary in by_op.items():
        recent = [w for w in written if w[0] == op and w[3] >= since.timestamp()]
        assert summary.num_verified == len(recent)
        assert summary.num_anomalies == expected_count(recent, 1e-3)
    assert report.num_anomalies == by_op["geglu"].num_anomalies > 0
    worst = [w.abs_error for w in report.worst]
    assert worst == sorted(worst, reverse=True) and len(worst) == 5
    assert all(w.op == "geglu" and w.is_anomaly for w in report.worst)
    assert worst[0] == pytest.approx(
        max(abs(o - e) for _, o, e, ts in written if ts >= since.timestamp())
    )


def test_nan_output_counts_as_an_anomaly(engine: Engine) -> None:
    with InferenceLogWriter(engine, migrate=False) as writer:
        writer.record(finished=[request_stats(0)], verified=[probe(0, "logit", math.nan, 1.0)])
        writer.record(verified=[probe(0, "attention", math.nan, math.nan)])
    with engine.connect() as conn:
        assert conn.execute(text(AUDIT_QUERY), {"threshold": 1e-3}).scalar_one() == 2


def test_default_thresholds_loosen_with_lower_precision() -> None:
    assert default_threshold("float32") == 1e-3
    assert (
        default_threshold("float32") < default_threshold("float16") < default_threshold("bfloat16")
    )
    assert default_threshold("torch.bfloat16") == default_threshold("bfloat16")


def invoke(*args: str):
    return CliRunner().invoke(cli, ["audit", *args])


def test_cli_exit_codes_and_json(engine: Engine, db_url: str) -> None:
    written = populate(engine)
    num_bad = expected_count(written, 1e-3)
    result = invoke("--database-url", db_url, "--json", "--threshold", "0.001")
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert report["num_anomalies"] == num_bad
    assert {s["op"]: s["num_anomalies"] for s in report["per_op"]}["geglu"] == num_bad

    ok = invoke("--database-url", db_url, "--max-anomalies", str(num_bad), "--threshold", "0.001")
    assert ok.exit_code == 0, ok.output
    assert "geglu" in ok.output and f"{num_bad} anomalies" in ok.output

    clean = invoke("--database-url", db_url, "--op", "swiglu", "--json")  # default threshold
    assert clean.exit_code == 0 and json.loads(clean.output)["num_anomalies"] == 0

    recent = invoke("--database-url", db_url, "--since", "1h", "--json", "--threshold", "1e-3")
    assert json.loads(recent.output)["num_anomalies"] == expected_count(
        written, 1e-3, since_ts=datetime.now(timezone.utc).timestamp() - HOUR
    )


def test_cli_rejects_a_bad_since(db_url: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--database-url", db_url, "--since", "yesterday"])
    assert exc.value.code == 2
