"""The status page's panel catalogue: every dashboard panel, its PromQL expanded the way Grafana
expands it, evaluable by the embedded subset, or saying why not."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from alerts.rules import load_rules
from dashboards.queries import PROMQL, SQL, all_queries
from runtime.server.status.catalog import PageWindow, build_catalog, expand
from runtime.server.status.page import ordered_dashboards, page_retention_s

RULES = [r for g in load_rules() for r in g.rules]
WINDOW = PageWindow.for_evaluator(interval_s=15.0, time_scale=1.0)


def _catalog(boards: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    panels = build_catalog(boards or ordered_dashboards(), WINDOW, RULES)
    return {p.key: p for p in panels}


def test_every_promql_panel_is_evaluable_and_every_sql_panel_says_why_not() -> None:
    catalog = _catalog()
    queries = all_queries()
    for query in queries:
        panel = catalog[f"{query.dashboard}-{query.panel_id}"]
        if query.kind == PROMQL:
            assert panel.problem is None, (query.where, panel.problem)
            assert query.ref_id in {t.ref_id for t in panel.targets}
        else:
            assert query.kind == SQL and panel.note and not panel.targets, query.where
    assert sum(len(p.targets) for p in catalog.values()) == sum(q.kind == PROMQL for q in queries)
    # the dashboards' first panels come first: overview, memory, batching, alerts, anomalies
    assert [p.split("-")[0] for p in catalog][:1] == ["overview"]


def test_grafana_variables_and_builtins_are_expanded() -> None:
    text = 'sum(rate(x_total{model=~"$model", version=~"${version}"}[$__rate_interval]))'
    assert expand(text, WINDOW, ["model", "version"]) == (
        'sum(rate(x_total{model=~".*", version=~".*"}[1m]))'  # max(4 x 15 s, 30 s step + 15 s)
    )
    assert expand("increase(x[$__range])", WINDOW, []) == "increase(x[1h])"
    # compressed clock (the tests' alerts_time_scale): real seconds, written in dashboard units
    fast = PageWindow.for_evaluator(interval_s=0.25, time_scale=0.005)
    assert (fast.range_s, fast.step_s, fast.rate_interval_s) == (18.0, 0.25, 1.0)
    assert expand("rate(x[$__rate_interval])", fast, []) == "rate(x[3m20s])"  # x 0.005 = 1 s


def test_a_panel_outside_the_subset_says_so() -> None:
    boards = copy.deepcopy(ordered_dashboards())
    panel = boards["overview"]["panels"][0]
    panel["targets"][0]["expr"] = "quantile_over_time(0.9, fastllm_batch_size_limit[5m])"
    boards["memory"]["panels"][0]["targets"][0]["expr"] = "rate(x[$__interval_ms])"
    catalog = _catalog(boards)
    assert "outside the embedded PromQL subset" in str(catalog["overview-1"].problem)
    assert "quantile_over_time" in str(catalog["overview-1"].problem)
    assert catalog["memory-1"].problem is not None  # a builtin the page does not know
    assert catalog["overview-2"].problem is None


def test_a_new_dashboard_panel_appears_with_its_alerts() -> None:
    boards = copy.deepcopy(ordered_dashboards())
    new = copy.deepcopy(boards["memory"]["panels"][1])
    new.update(id=99, title="KV pages in use")
    new["targets"][0]["expr"] = "fastllm_kv_cache_usage_ratio"
    boards["memory"]["panels"].append(new)
    catalog = _catalog(boards)
    assert catalog["memory-99"].title == "KV pages in use"
    assert catalog["memory-99"].alert_names == ()  # no rule reads it
    assert "FastllmMemoryGrowth" in catalog["memory-2"].alert_names
    utilization = catalog["batching-1"].alert_names
    assert {"FastllmDeviceUtilizationLow", "FastllmDeviceUtilizationHigh"} <= set(utilization)


@pytest.mark.parametrize("scale", [1.0, 0.005])
def test_the_store_keeps_the_window_and_its_widest_rate(scale: float) -> None:
    window = PageWindow.for_evaluator(interval_s=15.0 * scale, time_scale=scale)
    assert page_retention_s(scale) >= window.range_s + window.rate_interval_s + 300 * scale
