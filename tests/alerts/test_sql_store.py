"""The SQL sample store (metric_samples) gives the same alert timeline as the memory store, and
transitions land in alert_events."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

from alerts.events import SqlEvents
from alerts.manager import RuleManager
from alerts.promql.types import make_labels
from alerts.rules import load_rules
from alerts.sql_store import SqlSampleStore
from storage.models import Base
from storage.store import MetricStore
from tests.alerts.promtool_replay import replay_file

TESTS = Path(__file__).parents[2] / "alerts" / "tests"


def _metric_store() -> MetricStore:
    engine = create_engine(
        "sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False}
    )
    Base.metadata.create_all(engine)
    return MetricStore(engine)


@pytest.mark.parametrize("name", ["runtime_down.test.yml"])
def test_sql_store_replays_promtool_tests(name: str) -> None:
    checks = replay_file(TESTS / name, store_factory=lambda: SqlSampleStore(_metric_store()))
    for check in checks:
        got = sorted(sorted(labels.items()) for labels, _ in check.actual)
        want = sorted(sorted(labels.items()) for labels, _ in check.expected)
        assert got == want, (name, check.test_index, check.eval_time_s)


def test_rows_and_events_are_written() -> None:
    metric_store = _metric_store()
    store = SqlSampleStore(metric_store)
    manager = RuleManager(load_rules(), store)
    events = SqlEvents(metric_store)
    up = make_labels({"__name__": "up", "job": "fastllm", "instance": "a:1"})
    t0 = 1_700_000_000.0
    for i in range(5):
        store.append(t0 + 60 * i, [(up, 0.0)])
        events.record(manager.evaluate(t0 + 60 * i))
    rows = metric_store.samples("up")
    assert [r.labels for r in rows] == [{"job": "fastllm", "instance": "a:1"}] * 5
    recorded = metric_store.alert_events(alertname="FastllmRuntimeDown")
    assert [(e.state, e.ts.timestamp() - t0) for e in recorded] == [
        ("pending", 0.0),
        ("firing", 120.0),
    ]
    assert recorded[1].labels["instance"] == "a:1"
    store.prune(t0 + 150)
    assert len(metric_store.samples("up")) == 2
