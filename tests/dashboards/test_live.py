"""Every dashboard query returns data from the real thing.

A live `fastllm` server (the tiny demo llama, real engine, storage on PostgreSQL) serves a short
HTTP load; a real Prometheus scrapes its /metrics with the project's alert rules loaded. Then:
- every PromQL expression, template variables substituted with the values the variables' own
  `label_values` queries return, must return at least one non-NaN sample (a metric name the
  runtime does not export fails with the panel's title);
- every SQL panel query, Grafana macros expanded, run as the read-only `grafana_ro` role that
  deploy/postgres/init creates, must return rows, and the anomaly panels must agree with the
  storage audit (`storage.run_audit`).

A PEFT adapter is served beside the base model and every fifth request selects it, so the LoRA
panels have an adapter to show. Every request is verified on the real reference path
(verify_sample_rate=1.0); after Prometheus's first scrape the model's SwiGLU kernel is swapped for
one that corrupts a fraction of its outputs, so the anomaly panels and the
FastllmOperatorAnomalies alert have real anomalies to show.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from bench.lora import write_adapter
from dashboards.macros import expand_promql, expand_sql
from dashboards.queries import PROMQL, SQL, all_queries, load_generated, variable_queries
from runtime.config import Settings
from runtime.models import ops
from runtime.models.loader import read_args
from runtime.server.wiring import build_state
from storage import make_engine, run_audit
from tests.dashboards.support import ROOT, TEST_PASSWORD, dsn, run_init_script
from tests.fixtures.pgcluster import PostgresCluster
from tests.fixtures.prometheus import PromHandle, start_prometheus
from tests.runtime.server.live import LiveServer
from tests.runtime.verify.support import corrupting

MODEL = "llama"
ADAPTER = "sql"  # a LoRA adapter on MODEL (random A and B), selected by `model`
RULES = ROOT / "alerts/rules/fastllm.rules.yml"
# Always pending (never firing within a test), so the pending-state panels have a series.
PENDING_RULE = """groups:
  - name: dashboards-test
    rules:
      - alert: DashboardsTestPending
        expr: fastllm_batch_size_limit > 0
        for: 1h
"""
# (op, abs error): logit within the fp32 threshold, two ops drifting past it
MIN_REQUESTS = 3  # completed before Prometheus starts, so every series exists at its first scrape


@dataclass
class Load:
    """A few clients sending completions (some streamed, some invalid) until stopped."""

    url: str
    request_ids: list[str] = field(default_factory=list)
    num_ok: int = 0
    num_rejected: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _client(self, k: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            i = 0
            while not self._stop.is_set():
                i += 1
                model = ADAPTER if i % 5 == 3 else MODEL
                body: dict[str, Any] = {"model": model, "prompt": f"hello {k} {i}", "max_tokens": 6}
                if i % 7 == 1:  # the first request of each client, then every 7th
                    body["max_tokens"] = -1  # 400: counted as failure reason "validation"
                body["stream"] = i % 3 == 0
                if i % 4 == 2:  # structured output: a new grammar (a compile) or a cached one
                    body["guided_choice"] = ["yes", "no", f"{k}-{i}" if i % 8 == 2 else "maybe"]
                response = client.post("/v1/completions", json=body)
                if response.status_code == 200:
                    self.num_ok += 1
                    if not body["stream"]:
                        self.request_ids.append(response.json()["id"])
                elif response.status_code == 400:
                    self.num_rejected += 1
                else:
                    self.errors.append(f"{response.status_code}: {response.text[:200]}")
                time.sleep(0.05)

    def start(self, num_clients: int = 3) -> None:
        for k in range(num_clients):
            thread = threading.Thread(target=self._client, args=(k,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


@dataclass
class Stack:
    server: LiveServer
    prom: PromHandle
    database_url: str
    load: Load


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def stack(
    postgres_cluster: PostgresCluster,
    demo_model_dir: Callable[[str], Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    database = postgres_cluster.create_database()
    url = postgres_cluster.url(database)
    init = run_init_script(url)  # as in compose: the role exists before the runtime migrates
    assert init.returncode == 0, init.stderr
    model_dir = demo_model_dir("llama")
    adapter = write_adapter(read_args(model_dir), tmp_path_factory.mktemp("lora"), 4, seed=1)
    settings = Settings(
        model_path=model_dir,
        model_name=MODEL,
        loras=[f"{ADAPTER}={adapter}"],
        device="cpu",
        database_url=url,
        storage_enabled=True,
        alerts_enabled=False,
        tracing_enabled=False,
        max_num_seqs=8,
        kv_cache_bytes=64 << 20,
        verify_sample_rate=1.0,
    )
    patch = pytest.MonkeyPatch()
    server = LiveServer(build_state(settings))
    load = Load(server.url)
    prom: PromHandle | None = None
    try:
        server.start()
        load.start()
        wait_until(lambda: len(load.request_ids) >= MIN_REQUESTS, "completed requests")
        rules = tmp_path_factory.mktemp("rules") / "pending.yml"
        rules.write_text(PENDING_RULE)
        prom = start_prometheus(
            tmp_path_factory.mktemp("prometheus"),
            [f"127.0.0.1:{server.port}"],
            rule_files=[RULES, rules],
        )
        prom.wait_for_scrape()
        # after the first scrape, so Prometheus sees the anomaly counter increase: from now on
        # the served model's SwiGLU kernel is broken the way a bad kernel would be, and the real
        # verification path (every request sampled) records the anomalies
        patch.setattr(ops, "swiglu", corrupting(ops.swiglu, fraction=0.05))
        prom.wait_for("sum(rate(fastllm_request_success_total[30s])) > 0", timeout_s=60)
        prom.wait_for('ALERTS{alertname="FastllmOperatorAnomalies", alertstate="firing"}')
        prom.wait_for('ALERTS{alertname="DashboardsTestPending", alertstate="pending"}')
        yield Stack(server, prom, url, load)
    finally:
        patch.undo()
        load.stop()
        if prom is not None:
            prom.stop()
        server.stop()
        postgres_cluster.drop_database(database)


def resolve_variables(prom: PromHandle) -> dict[str, str]:
    """Each query variable's first value, as its `label_values(selector, label)` returns them
    (chained: version's selector uses the chosen model)."""
    values: dict[str, str] = {}
    for variable in variable_queries():
        if variable.name in values:
            continue
        selector = expand_promql(variable.selector, values)
        series = prom.api("series", **{"match[]": selector})
        found = sorted({s[variable.label] for s in series if variable.label in s})
        assert found, f"variable {variable.name}: {variable.selector} has no values"
        values[variable.name] = MODEL if MODEL in found else found[0]
    return values


def test_every_promql_panel_returns_data(stack: Stack) -> None:
    values = resolve_variables(stack.prom)
    assert values["model"] == MODEL and values["version"] == "stable"
    assert values["instance"] == f"127.0.0.1:{stack.server.port}"
    # the check can fail: a name the runtime does not export has no data
    assert not stack.prom.query("sum(rate(fastllm_not_exported_total[30s]))")
    # A histogram panel is NaN over a window with no observation. Grammar compiles come every
    # eighth request of a client; under the full suite's load a client's requests took seconds
    # each and the 30 s window once held none. So the queries start within 15 s of a compile.
    with_compile = "sum(increase(fastllm_grammar_compile_seconds_count[15s])) > 0"
    try:
        stack.prom.wait_for(with_compile, timeout_s=90)
    except TimeoutError as exc:
        load = stack.load
        raise AssertionError(
            f"no grammar compile recorded in 90 s: {load.num_ok} ok, "
            f"{load.num_rejected} rejected, errors {load.errors[:5]}"
        ) from exc
    queries = [q for q in all_queries() if q.kind == PROMQL]
    failures = []
    for query in queries:
        expr = expand_promql(query.text, values, rate_interval="30s", range_="1h")
        samples = stack.prom.query(expr)
        if not samples:
            failures.append(f"{query.where}: no data for {expr}")
        elif all(math.isnan(s.value) for s in samples):
            failures.append(f"{query.where}: only NaN for {expr}")
    assert not failures, "\n".join([*failures, f"load errors: {stack.load.errors[:5]}"])
    assert stack.load.num_rejected > 0 and not stack.load.errors, stack.load.errors


def threshold_value() -> str:
    variables = load_generated()["anomalies"]["templating"]["list"]
    return str(next(v for v in variables if v["name"] == "threshold")["current"]["value"])


def test_every_sql_panel_returns_rows_as_the_read_only_role(stack: Stack) -> None:
    # quiesce first: the load and the verifier keep adding rows, and the panels are compared with
    # the audit below, so the counts must stand still
    stack.load.stop()
    for _model, _version, engine in stack.server.state.router.engines():
        wait_until(lambda e=engine: e.num_running + e.num_waiting == 0, "an idle engine")
        assert engine.verifier is not None and engine.verifier.flush(timeout=60)
    writer = stack.server.state.writer
    assert writer.flush(timeout=30)
    threshold = threshold_value()
    values = {"model": MODEL, "version": "stable", "threshold": threshold}
    end = datetime.now(timezone.utc) + timedelta(minutes=1)
    results: dict[str, list[tuple[Any, ...]]] = {}
    ro = dsn(stack.database_url, "grafana_ro", TEST_PASSWORD)
    with psycopg.connect(ro, autocommit=True) as conn:
        served = conn.execute("SELECT COUNT(*) FROM inference_log WHERE op IS NULL").fetchone()
        assert served is not None and served[0] > 0  # rows the runtime wrote for its requests
        for query in (q for q in all_queries() if q.kind == SQL):
            sql = expand_sql(query.text, values, start=end - timedelta(hours=1), end=end)
            rows = conn.execute(sql).fetchall()
            assert rows, f"{query.where}: no rows for\n{sql}"
            results[query.panel_title] = rows

    engine = make_engine(stack.database_url)
    try:
        audit = run_audit(engine, float(threshold))
    finally:
        engine.dispose()
    expected = {s.op: (s.num_verified, s.num_anomalies) for s in audit.per_op}
    anomalous = {op for op, (_, bad) in expected.items() if bad}
    # the broken SwiGLU shows in its own probe and, through the model, in the final logit; the
    # other ops' probes run the correct kernels and stay clean
    assert "swiglu" in anomalous and anomalous <= {"swiglu", "logit"}

    summary = results["Verified rows per op (inference_log)"]
    assert {op: (n, bad) for op, n, bad, _worst in summary} == expected
    per_bucket = results["Anomalies per op over time (inference_log, threshold $threshold)"]
    totals: dict[str, int] = {}
    for _time, op, count in per_bucket:
        totals[op] = totals.get(op, 0) + count
    assert totals == {op: bad for op, (_, bad) in expected.items() if bad}
    latest = results["Latest anomalous rows (inference_log)"]
    assert len(latest) == min(audit.num_anomalies, 50)  # the panel shows the latest 50
    assert all(row[-1] > float(threshold) for row in latest)
