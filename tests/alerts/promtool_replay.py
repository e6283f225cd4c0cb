"""Replays a `promtool test rules` file through the embedded evaluator on a virtual clock.

Reads the same YAML promtool reads: input_series in promtool's expanding notation
(`a+bxn`, `a-bxn`, `axn`, `_`, `_xn`, `stale`), evaluates the rules on the
`evaluation_interval` grid from t=0, and reports, for every alert_rule_test, the firing alerts
the evaluator shows at the grid step promtool compares (the last step <= eval_time).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from alerts.manager import RuleManager
from alerts.promql import ast, parse, parse_duration
from alerts.promql.types import Labels, make_labels
from alerts.rules import load_rules
from alerts.state import FIRING
from alerts.store import MemorySampleStore, SampleStore

_NUM = r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+|Inf|NaN)"
_EXPAND = re.compile(rf"^({_NUM})([+-])(\d+\.?\d*(?:[eE][+-]?\d+)?)x(\d+)$")
_REPEAT = re.compile(rf"^({_NUM})x(\d+)$")
_BLANKS = re.compile(r"^_x(\d+)$")
STALE = "stale"


def expand_values(text: str) -> list[float | str | None]:
    """promtool's notation -> one entry per interval: float, None (no sample) or STALE."""
    out: list[float | str | None] = []
    for token in str(text).split():
        if token == "_":
            out.append(None)
        elif token == STALE:
            out.append(STALE)
        elif m := _BLANKS.match(token):
            out.extend([None] * int(m.group(1)))
        elif m := _EXPAND.match(token):
            start, step, count = float(m.group(1)), float(m.group(3)), int(m.group(4))
            step = step if m.group(2) == "+" else -step
            out.extend(start + i * step for i in range(count + 1))
        elif m := _REPEAT.match(token):
            out.extend([float(m.group(1))] * (int(m.group(2)) + 1))
        else:
            out.append(float(token))
    return out


def series_labels(text: str) -> Labels:
    selector = parse(text)
    assert isinstance(selector, ast.VectorSelector), text
    return make_labels((m.name, m.value) for m in selector.matchers if m.op == "=")


@dataclass(frozen=True)
class Check:
    test_index: int
    eval_time_s: float
    alertname: str
    expected: list[tuple[dict[str, str], dict[str, str]]]  # (labels incl. alertname, annotations)
    actual: list[tuple[dict[str, str], dict[str, str]]]


@dataclass(frozen=True)
class ExprCheck:
    test_index: int
    expr: str
    eval_time_s: float
    expected: list[tuple[Labels, float]]
    actual: list[tuple[Labels, float]]


def replay_file(
    path: Path,
    time_scale: float = 1.0,
    store_factory: Callable[[], SampleStore] = MemorySampleStore,
) -> list[Check]:
    """Every alert_rule_test of the file with what the embedded evaluator produced."""
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    rule_files = [path.parent / f for f in document["rule_files"]]
    eval_interval = parse_duration(str(document.get("evaluation_interval", "1m")))
    checks: list[Check] = []
    for index, test in enumerate(document["tests"]):
        groups = [g for f in rule_files for g in load_rules(f, time_scale=time_scale)]
        store = store_factory()
        interval = parse_duration(str(test.get("interval", "1m")))
        for series in test.get("input_series", []):
            labels = series_labels(series["series"])
            for i, value in enumerate(expand_values(series["values"])):
                if value is not None:
                    point = None if value == STALE else float(value)
                    store.append(i * interval * time_scale, [(labels, point)])
        manager = RuleManager(groups, store)
        _expr_checks(index, test, manager, time_scale)
        wanted = sorted(
            test.get("alert_rule_test", []), key=lambda c: parse_duration(c["eval_time"])
        )
        step, t = 0, 0.0
        snapshots: dict[float, list[tuple[dict[str, str], dict[str, str]]]] = {}
        end = max((parse_duration(c["eval_time"]) for c in wanted), default=0.0)
        while t <= end:
            manager.evaluate(t * time_scale)
            snapshots[t] = [
                (dict(a.labels), dict(a.annotations)) for a in manager.alerts((FIRING,))
            ]
            step += 1
            t = step * eval_interval
        for case in wanted:
            at = parse_duration(case["eval_time"])
            grid = max(s for s in snapshots if s <= at)
            name = case["alertname"]
            expected = [
                (
                    {
                        **{k: str(v) for k, v in (e.get("exp_labels") or {}).items()},
                        "alertname": name,
                    },
                    {k: str(v) for k, v in (e.get("exp_annotations") or {}).items()},
                )
                for e in case.get("exp_alerts") or []
            ]
            actual = [a for a in snapshots[grid] if a[0]["alertname"] == name]
            checks.append(Check(index, at, name, expected, actual))
    return checks


_EXPR_CHECKS: list[ExprCheck] = []


def _expr_checks(index: int, test: dict[str, Any], manager: RuleManager, scale: float) -> None:
    for case in test.get("promql_expr_test") or []:
        at = parse_duration(case["eval_time"])
        result = manager.engine.instant(parse(case["expr"]), at * scale)
        actual = [(s.labels, s.value) for s in result] if isinstance(result, list) else []
        expected = [
            (series_labels(e["labels"]) if e.get("labels") else (), float(e["value"]))
            for e in case.get("exp_samples") or []
        ]
        _EXPR_CHECKS.append(ExprCheck(index, case["expr"], at, expected, actual))


def replay_exprs(path: Path) -> list[ExprCheck]:
    """The promql_expr_test cases of the file with the embedded engine's results."""
    _EXPR_CHECKS.clear()
    replay_file(path)
    return list(_EXPR_CHECKS)
