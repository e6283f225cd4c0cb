"""Structure of the generated dashboards: datasources by uid, ids, the 24-column grid, template
variables, and only contract metric names in queries."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from dashboards.build import GENERATED_DIR
from dashboards.queries import (
    PROMQL,
    SQL,
    all_queries,
    load_generated,
    metric_names,
    panels,
    variable_queries,
)
from monitoring.lora_metrics import LORA_METRIC_NAMES
from monitoring.metric_names import CONTRACT_METRIC_NAMES

PROVISIONED = GENERATED_DIR.parent.parent / "deploy/grafana/provisioning/datasources/fastllm.yml"
EXTRA_NAMES = {"ALERTS", "up"}  # Prometheus' own series
# read from the engines' adapter registries once they load (DESIGN.md's fastllm_lora_adapters and
# fastllm_lora_requests_total, with loads, evictions and bytes): a runtime's scrape shows them,
# a registry without engines does not, so they are not in CONTRACT_METRIC_NAMES; test_live.py
# proves each LoRA panel returns data from a real runtime serving an adapter
ENGINE_NAMES = set(LORA_METRIC_NAMES)
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
DASHBOARDS = load_generated()


def provisioned_uids() -> set[str]:
    return {d["uid"] for d in yaml.safe_load(PROVISIONED.read_text())["datasources"]}


def contract_name(name: str) -> bool:
    if name in CONTRACT_METRIC_NAMES or name in EXTRA_NAMES or name in ENGINE_NAMES:
        return True
    return any(
        name.endswith(s) and name.removesuffix(s) in CONTRACT_METRIC_NAMES
        for s in HISTOGRAM_SUFFIXES
    )


def test_the_five_dashboards_exist() -> None:
    assert set(DASHBOARDS) == {"overview", "memory", "batching", "anomalies", "alerts"}


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panels_have_datasource_uid_unique_id_and_fit_the_grid(name: str) -> None:
    dashboard = DASHBOARDS[name]
    known = provisioned_uids() | {"grafana"}  # "grafana": the built-in source of text panels
    ids: list[int] = []
    cells: dict[tuple[int, int], str] = {}
    for panel in panels(dashboard):
        title = panel["title"]
        source: dict[str, Any] = panel.get("datasource") or {}
        assert source.get("uid") in known, f"{name}/{title}: datasource {source}"
        for target in panel.get("targets", []):
            assert (target.get("datasource") or source)["uid"] in known, f"{name}/{title}"
        assert isinstance(panel.get("id"), int), f"{name}/{title}: no id"
        ids.append(panel["id"])
        pos = panel["gridPos"]
        assert pos["w"] >= 1 and pos["h"] >= 1 and pos["x"] >= 0 and pos["y"] >= 0, title
        assert pos["x"] + pos["w"] <= 24, f"{name}/{title} leaves the 24-column grid: {pos}"
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                other = cells.setdefault((x, y), title)
                assert other == title, f"{name}: {title!r} overlaps {other!r} at ({x}, {y})"
    assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids {ids}"
    assert ids, f"{name} has no panels"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_template_variables_and_schema(name: str) -> None:
    dashboard = DASHBOARDS[name]
    assert dashboard["schemaVersion"] >= 36
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"model", "version", "instance"} <= names
    if name == "anomalies":
        threshold = next(v for v in dashboard["templating"]["list"] if v["name"] == "threshold")
        assert float(threshold["current"]["value"]) > 0


def test_every_query_names_only_contract_metrics() -> None:
    queries = all_queries()
    assert {q.kind for q in queries} == {PROMQL, SQL}
    for query in queries:
        if query.kind != PROMQL:
            continue
        names = metric_names(query.text)
        assert names, f"{query.where}: no metric name in {query.text}"
        unknown = sorted(n for n in names if not contract_name(n))
        assert not unknown, f"{query.where}: not in the metric contract: {unknown}"
    for variable in variable_queries():
        assert all(contract_name(n) for n in metric_names(variable.selector)), variable


def test_sql_panels_use_the_postgres_datasource_and_inference_log() -> None:
    sql = [q for q in all_queries() if q.kind == SQL]
    assert len(sql) >= 2
    for query in sql:
        assert query.datasource_uid == "postgres"
        assert "inference_log" in query.text and "$__timeFilter(ts)" in query.text, query.where


def test_metric_name_extraction() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(fastllm_a_bucket{model=~"$model", '
        'x="up"}[$__rate_interval]))) / on (instance) group_left (type) fastllm_b '
        "or vector(1) and ALERTS offset 5m > bool 1e-3"
    )
    assert metric_names(expr) == {"fastllm_a_bucket", "fastllm_b", "ALERTS"}
    assert metric_names("sum without (op) (increase(fastlm_typo_total[1h]))") == {
        "fastlm_typo_total"
    }
    assert not contract_name("fastlm_typo_total")
    assert contract_name("fastllm_batch_size_bucket") and contract_name("up")
