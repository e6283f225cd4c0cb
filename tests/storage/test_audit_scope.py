"""The audit of one server among several sharing a database, and of rows checked against their
own tolerance: a second server's anomalies are not this one's, and a quantized model's logit
row within its recorded tolerance is no anomaly (issue 39). Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time
from dataclasses import replace

from click.testing import CliRunner
from sqlalchemy import Engine, func, select

from runtime.cli import cli
from runtime.engine.stats import VerificationResult
from storage.audit import run_audit
from storage.models import InferenceLog
from storage.writer import InferenceLogWriter
from tests.storage.factories import request_stats

QUANT, FP32 = "127.0.0.1:8001", "127.0.0.1:8002"


def _logit(i: int, model: str, error: float, tolerance: float | None) -> VerificationResult:
    expected = 30.0 + i % 3
    return VerificationResult(
        f"req-{i}", model, "stable", "logit", expected + error, expected, time.time(), tolerance
    )


def populate(engine: Engine) -> None:
    """Server QUANT (int4 SmolLM2): 13 logit rows 0.08 off, each within its recorded 0.55;
    one of them 2.0 off (a broken kernel). Server FP32 (another model): 5 clean rows."""
    with InferenceLogWriter(engine, migrate=False, instance=QUANT) as quant:
        for i in range(14):
            stats = replace(request_stats(i), model="smollm2")
            error = 2.0 if i == 13 else 0.08
            quant.record(finished=[stats], verified=[_logit(i, "smollm2", error, 0.55)])
    with InferenceLogWriter(engine, migrate=False, instance=FP32) as fp32:
        for i in range(100, 105):
            stats = replace(request_stats(i), model="tiny")
            fp32.record(finished=[stats], verified=[_logit(i, "tiny", 1e-5, 1e-3)])


def test_rows_record_their_tolerance_and_instance(engine: Engine) -> None:
    populate(engine)
    t = InferenceLog
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.instance, t.tolerance, func.count()).group_by(t.instance, t.tolerance)
        ).all()
    assert sorted(rows) == [(QUANT, 0.55, 14), (FP32, 0.001, 5)]


def test_each_row_against_its_own_tolerance(engine: Engine) -> None:
    populate(engine)
    fixed = run_audit(engine, 0.05)  # the guide's query: one bound for every row
    assert fixed.num_anomalies == 14
    per_row = run_audit(engine, 0.05, per_row=True)
    assert per_row.num_anomalies == 1
    (worst, *_) = per_row.worst
    assert worst.request_id == "req-13" and worst.is_anomaly and worst.tolerance == 0.55
    assert [w.is_anomaly for w in per_row.worst].count(True) == 1


def test_scope_keeps_to_one_server(engine: Engine) -> None:
    populate(engine)
    fp32 = run_audit(engine, 1e-3, per_row=True, models=["tiny"], instance=FP32)
    assert fp32.num_anomalies == 0 and sum(s.num_verified for s in fp32.per_op) == 5
    assert {w.instance for w in fp32.worst} == {FP32}
    every = run_audit(engine, 1e-3, per_row=True)
    assert sum(s.num_verified for s in every.per_op) == 19 and every.num_anomalies == 1
    wrong = run_audit(engine, 1e-3, per_row=True, models=["smollm2"], instance=FP32)
    assert sum(s.num_verified for s in wrong.per_op) == 0


def _audit(url: str, *args: str, env: dict[str, str | None]) -> dict:
    argv = ["audit", "--database-url", url, "--json", *args]
    result = CliRunner().invoke(cli, argv, env={"FASTLLM_VERIFY_THRESHOLD": None, **env})
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.output)


def test_cli_defaults_to_the_configured_model(engine: Engine, db_url: str) -> None:
    populate(engine)
    env: dict[str, str | None] = {"FASTLLM_MODEL_NAME": "tiny", "FASTLLM_MODEL_PATH": None}
    served = _audit(db_url, env=env)
    assert served["models"] == ["tiny"] and served["per_row"] is True
    assert served["num_anomalies"] == 0
    assert sum(s["num_verified"] for s in served["per_op"]) == 5
    every = _audit(db_url, "--all-models", env=env)
    assert every["models"] == [] and every["num_anomalies"] == 1
    one = _audit(db_url, "--model", "smollm2", "--instance", QUANT, env=env)
    assert one["num_anomalies"] == 1 and one["instance"] == QUANT
    fixed = _audit(db_url, "--model", "smollm2", "--threshold", "0.05", env=env)
    assert fixed["per_row"] is False and fixed["num_anomalies"] == 14
    unconfigured = _audit(db_url, env={"FASTLLM_MODEL_NAME": None, "FASTLLM_MODEL_PATH": None})
    assert unconfigured["models"] == [] and unconfigured["num_anomalies"] == 1
