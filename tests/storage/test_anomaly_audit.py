"""End to end: engine → verifier → inference_log writer + Prometheus sink → `fastllm audit`.

A fast GeGLU that corrupts a fraction of its outputs (monkeypatched, the way a broken kernel
would) must show up in the audit as geglu anomalies (exit 1) and in
fastllm_operator_anomalies_total{op="geglu"}; the correct kernels must give zero anomalies over
1,000 verified fp32 requests at the default threshold.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, func, select

from monitoring.metrics import FastllmMetrics
from monitoring.prometheus_sink import PrometheusSink
from runtime.cli import cli
from runtime.config import Settings
from runtime.models import ops
from storage.audit import default_threshold
from storage.db import make_engine, upgrade
from storage.models import InferenceLog
from storage.writer import InferenceLogWriter
from tests.runtime.verify.support import corrupting, random_prompts, serve, verified_engine

OPS = ("logit", "rms_norm", "rotary", "attention", "geglu")


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def prometheus() -> tuple[CollectorRegistry, PrometheusSink]:
    registry = CollectorRegistry()
    metrics = FastllmMetrics.create(registry, latency_buckets_s=Settings().latency_buckets_s)
    sink = PrometheusSink(
        metrics, models=[("tiny", "stable")], anomaly_threshold=default_threshold("float32")
    )
    return registry, sink


def anomalies(registry: CollectorRegistry, op: str) -> float | None:
    labels = {"model": "tiny", "version": "stable", "op": op}
    return registry.get_sample_value("fastllm_operator_anomalies_total", labels)


def audit(url: str, *args: str) -> tuple[int, dict[str, Any]]:
    argv = ["audit", "--database-url", url, "--dtype", "float32", "--json", *args]
    result = CliRunner().invoke(cli, argv, env={"FASTLLM_VERIFY_THRESHOLD": None})
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.output)


def serve_and_store(
    model_dir: Path, engine: Engine, prompts: list[list[int]], **config: Any
) -> CollectorRegistry:
    registry, sink = prometheus()
    writer = InferenceLogWriter(engine, migrate=False, batch_size=128)
    with verified_engine(model_dir, [sink, writer], **config) as (llm, verifier):
        outputs = serve(llm, prompts, max_tokens=1)
        assert verifier.flush(timeout=120)
    assert all(o.error is None for o in outputs)
    assert verifier.num_verified == len(prompts) and verifier.num_dropped == 0
    assert writer.close(timeout=60)
    return registry


def test_broken_geglu_is_caught_by_audit_and_counter(
    db_url: str,
    engine: Engine,
    demo_model_dir: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ops, "geglu", corrupting(ops.geglu, fraction=0.05))
    n = 24
    registry = serve_and_store(demo_model_dir("gemma"), engine, random_prompts(n, 500))

    code, report = audit(db_url, "--op", "geglu")
    assert code == 1  # anomalies beyond --max-anomalies 0
    (geglu,) = report["per_op"]
    assert (geglu["op"], geglu["num_verified"], geglu["num_anomalies"]) == ("geglu", n, n)
    assert report["num_anomalies"] == n  # the guide's COUNT(*), op-filtered
    assert anomalies(registry, "geglu") == n  # the counter agrees with the audit

    code, report = audit(db_url)
    per_op = {row["op"]: row for row in report["per_op"]}
    assert set(per_op) == set(OPS) and all(row["num_verified"] == n for row in per_op.values())
    for op in ("rms_norm", "rotary", "attention"):  # the probes pinpoint the broken op
        assert per_op[op]["num_anomalies"] == 0 and anomalies(registry, op) == 0
    assert per_op["logit"]["num_anomalies"] == anomalies(registry, "logit") > 0
    with engine.connect() as conn:  # the logit probe lives on each request's own row
        rows = conn.execute(
            select(func.count()).where(InferenceLog.status != "probe", InferenceLog.op == "logit")
        ).scalar_one()
    assert rows == n


def test_correct_kernels_give_no_false_positives_over_1000_requests(
    tmp_path: Path, demo_model_dir: Callable[[str], Path]
) -> None:
    url = f"sqlite:///{tmp_path / 'fastllm.db'}"
    engine = make_engine(url)
    upgrade(engine)
    n = 1000
    prompts = random_prompts(n, 500, max_len=6, seed=11)
    registry = serve_and_store(demo_model_dir("gemma"), engine, prompts, max_queued_requests=n)
    engine.dispose()

    code, report = audit(url)
    assert code == 0 and report["num_anomalies"] == 0
    per_op = {row["op"]: row for row in report["per_op"]}
    assert {op: row["num_verified"] for op, row in per_op.items()} == dict.fromkeys(OPS, n)
    assert all(row["max_abs_error"] <= report["threshold"] for row in per_op.values())
    assert all(anomalies(registry, op) == 0 for op in OPS)
