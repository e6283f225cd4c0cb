"""Parity: every promtool test file, replayed through the embedded evaluator on a virtual clock,
gives the alerts promtool expects (labels and rendered annotations) at every eval_time. The
promtool run itself (test_promtool.py) checks the same expectations against Prometheus."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from alerts.rules import load_rules
from tests.alerts.promtool_replay import expand_values, replay_exprs, replay_file

TEST_FILES = sorted((Path(__file__).parents[2] / "alerts" / "tests").glob("*.yml"))
# files with alert expectations (functions.test.yml holds expression tests only)
ALERT_TEST_FILES = [p for p in TEST_FILES if "alert_rule_test:" in p.read_text()]


def _canonical(alerts: list[tuple[dict[str, str], dict[str, str]]]) -> list[str]:
    return sorted(repr((sorted(labels.items()), sorted(ann.items()))) for labels, ann in alerts)


def test_there_are_test_files_for_every_rule() -> None:
    text = "".join(p.read_text() for p in TEST_FILES)
    for rule in load_rules()[0].rules:
        assert f"alertname: {rule.name}" in text, rule.name


@pytest.mark.parametrize("path", ALERT_TEST_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("time_scale", [1.0, 0.25])
def test_embedded_evaluator_matches_promtool_expectations(path: Path, time_scale: float) -> None:
    # time_scale 0.25 shrinks every `for:`, range and offset, and the replay's clock with them:
    # the same timeline must come out (what end-to-end tests rely on to shorten windows)
    checks = replay_file(path, time_scale=time_scale)
    assert checks
    fired = 0
    for check in checks:
        where = f"{path.name} test #{check.test_index} {check.alertname} at {check.eval_time_s}s"
        assert _canonical(check.actual) == _canonical(check.expected), where
        fired += len(check.actual)
    assert fired > 0  # every file shows some alert firing, not only silence


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_expression_results_match(path: Path) -> None:
    checks = replay_exprs(path)
    assert checks, f"{path.name} has no promql_expr_test: nothing would be compared"
    for check in checks:
        assert sorted(lb for lb, _ in check.actual) == sorted(lb for lb, _ in check.expected)
        for (_, got), (_, want) in zip(sorted(check.actual), sorted(check.expected), strict=True):
            assert math.isclose(got, want, rel_tol=1e-12), check.expr


def test_functions_file_matches_promtool_exactly() -> None:
    # promtool 2.42 compares exactly; so does this, for the functions the status page uses
    checks = replay_exprs(TEST_FILES[0].parent / "functions.test.yml")
    assert any("histogram_quantile" in c.expr for c in checks)
    for check in checks:
        assert sorted(check.actual) == sorted(check.expected), check.expr


def test_series_notation() -> None:
    assert expand_values("1+2x3 _ 5 _x2 stale 7x1 10-1x2") == [
        1.0,
        3.0,
        5.0,
        7.0,
        None,
        5.0,
        None,
        None,
        "stale",
        7.0,
        7.0,
        10.0,
        9.0,
        8.0,
    ]
