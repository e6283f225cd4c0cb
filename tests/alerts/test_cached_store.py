"""The SQL store with this process's samples kept in memory: the same alert timelines as the
plain stores, every point still in metric_samples, and a previous run's history still read."""

from __future__ import annotations

from pathlib import Path

from alerts.cached_store import CachedSampleStore
from alerts.promql import Matcher
from alerts.promql.types import make_labels
from alerts.sql_store import SqlSampleStore
from storage.store import MetricStore
from tests.alerts.promtool_replay import replay_file
from tests.alerts.test_sql_store import _metric_store

TESTS = Path(__file__).parents[2] / "alerts" / "tests"
UP = make_labels({"__name__": "up", "job": "fastllm", "instance": "a:1"})
NAME = [Matcher.create("__name__", "=", "up")]


def test_replays_promtool_tests_like_the_other_stores() -> None:
    def store() -> CachedSampleStore:
        return CachedSampleStore(SqlSampleStore(_metric_store()))

    for name in ("runtime_down.test.yml",):
        checks = replay_file(TESTS / name, store_factory=store)
        assert checks
        for check in checks:
            got = sorted(sorted(labels.items()) for labels, _ in check.actual)
            want = sorted(sorted(labels.items()) for labels, _ in check.expected)
            assert got == want, (name, check.test_index, check.eval_time_s)


def test_reads_come_from_memory_after_the_first_round_and_from_sql_before() -> None:
    metric_store: MetricStore = _metric_store()
    previous = SqlSampleStore(metric_store)  # an earlier run of the process
    previous.append(100.0, [(UP, 1.0)])
    store = CachedSampleStore(SqlSampleStore(metric_store))
    store.append(200.0, [(UP, 0.0)])
    store.append(215.0, [(UP, None)])  # a staleness marker: memory and SQL both know it
    assert len(metric_store.samples("up")) == 2  # every real point is in the table
    [recent] = store.select(NAME, 200.0, 300.0)
    assert recent.points == [(200.0, 0.0), (215.0, None)]
    [history] = store.select(NAME, 50.0, 300.0)  # reaches before this run: SQL, with both runs
    assert history.points == [(100.0, 1.0), (200.0, 0.0), (215.0, None)]
    store.memory.append(230.0, [(UP, 5.0)])  # only in memory: proves which store answered
    assert store.select(NAME, 200.0, 300.0)[0].points[-1] == (230.0, 5.0)
    assert store.select(NAME, 50.0, 300.0)[0].points[-1] == (215.0, None)
    store.prune(210.0)
    assert [p[0] for p in store.select(NAME, 210.0, 300.0)[0].points] == [215.0, 230.0]
    assert len(metric_store.samples("up")) == 0
