"""Shared pieces of every fastllm dashboard: datasource references by uid (they match
deploy/grafana/provisioning/datasources), the template variables, label selectors, target helpers
and a row-based grid layout.

Only names from the DESIGN.md metric contract (plus `ALERTS` and `up`) may appear in queries;
tests/dashboards/test_static.py enforces it and tests/dashboards/test_live.py proves every query
returns data from a real Prometheus / PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attr
from grafanalib.core import (
    BarGauge,
    Dashboard,
    DashboardLink,
    GridPos,
    Panel,
    SqlTarget,
    Target,
    Template,
    Templating,
    Time,
)

SCHEMA_VERSION = 39  # Grafana 10.x/11.x dashboard schema
GRID_COLUMNS = 24
TAG = "fastllm"

PROMETHEUS: dict[str, str] = {"type": "prometheus", "uid": "prometheus"}
POSTGRES: dict[str, str] = {"type": "postgres", "uid": "postgres"}
JAEGER: dict[str, str] = {"type": "jaeger", "uid": "jaeger"}
GRAFANA: dict[str, str] = {"type": "datasource", "uid": "grafana"}  # built-in (text panels)

# Label selectors. Per-model metrics carry model/version; every scraped series carries instance.
MODEL_SEL = 'model=~"$model", version=~"$version", instance=~"$instance"'
INSTANCE_SEL = 'instance=~"$instance"'
RATE = "$__rate_interval"

# Audit threshold (absolute error) for fp32 serving; fp16 1e-2, bf16 5e-2 (storage/audit.py).
DEFAULT_THRESHOLD = "0.001"


def _all_selected(template: Template) -> Template:
    template._current = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return template


def _query_variable(name: str, label: str, query: str) -> Template:
    return _all_selected(
        Template(
            name=name,
            label=label,
            query=query,
            dataSource=PROMETHEUS,
            includeAll=True,
            allValue=".*",
            multi=True,
            refresh=2,  # on time range change: new models/instances show up
        )
    )


def variables(*, threshold: bool = False) -> list[Template]:
    """model, version and instance (chained); `threshold` adds the audit threshold textbox."""
    out = [
        _query_variable("model", "Model", "label_values(fastllm_num_requests_running, model)"),
        _query_variable(
            "version",
            "Version",
            'label_values(fastllm_num_requests_running{model=~"$model"}, version)',
        ),
        _query_variable(
            "instance", "Instance", "label_values(fastllm_device_utilization_ratio, instance)"
        ),
    ]
    if threshold:
        out.append(
            Template(
                name="threshold",
                label="Audit threshold (abs error)",
                query=DEFAULT_THRESHOLD,
                default=DEFAULT_THRESHOLD,
                type="textbox",
            )
        )
    return out


def prom(
    expr: str, legend: str = "", ref: str = "A", *, instant: bool = False, table: bool = False
) -> Target:
    return Target(
        expr=expr,
        format="table" if table else "time_series",
        legendFormat=legend,
        refId=ref,
        datasource=PROMETHEUS,
        instant=instant,
        intervalFactor=1,
    )


def sql(raw_sql: str, ref: str = "A", *, table: bool = False) -> SqlTarget:
    return SqlTarget(
        rawSql=raw_sql.strip(),
        refId=ref,
        datasource=POSTGRES,
        format="table" if table else "time_series",
    )


def quantiles(histogram: str, selector: str = MODEL_SEL) -> list[Target]:
    """p50, p95 and p99 of a contract histogram over the selected series."""
    buckets = f"sum by (le) (rate({histogram}_bucket{{{selector}}}[{RATE}]))"
    return [
        prom(f"histogram_quantile(0.5, {buckets})", "p50", "A"),
        prom(f"histogram_quantile(0.95, {buckets})", "p95", "B"),
        prom(f"histogram_quantile(0.99, {buckets})", "p99", "C"),
    ]


def or_zero(expr: str) -> str:
    """A count that reads 0, not "No data", when nothing matches (in Grafana and on the page)."""
    return f"{expr} or vector(0)"


@attr.s
class ModernBarGauge(BarGauge):  # type: ignore[misc]
    """grafanalib's BarGauge writes the Grafana 6 `options.fieldOptions` shape; Grafana migrates
    that shape over fieldConfig on load (losing unit, min, max). This writes only the Grafana 8+
    shape: fieldConfig defaults and options.reduceOptions."""

    unit: str = attr.ib(default="short")
    min_value: float | None = attr.ib(default=0)
    max_value: float | None = attr.ib(default=None)

    def to_json_data(self) -> dict[str, Any]:
        data: dict[str, Any] = super().to_json_data()
        data["options"] = {
            "displayMode": self.displayMode,
            "orientation": self.orientation,
            "reduceOptions": {"calcs": [self.calc], "fields": "", "values": False},
            "showUnfilled": True,
        }
        defaults = data["fieldConfig"]["defaults"]
        defaults.update(unit=self.unit, min=self.min_value, max=self.max_value)
        data["fieldConfig"].setdefault("overrides", [])
        return data


def bar_gauge(
    title: str,
    description: str,
    targets: list[Target],
    *,
    unit: str,
    steps: list[dict[str, Any]],
    min_value: float | None = 0,
    max_value: float | None = None,
) -> ModernBarGauge:
    # mypy's attrs plugin sees only this subclass's fields (grafanalib is untyped)
    return ModernBarGauge(  # type: ignore[call-arg]
        title=title,
        description=description,
        dataSource=PROMETHEUS,
        targets=targets,
        thresholds=steps,
        calc="lastNotNull",
        displayMode="gradient",
        unit=unit,
        min_value=min_value,
        max_value=max_value,
    )


Row = tuple[int, Sequence[tuple[int, Panel]]]  # (height, [(width, panel), ...])


def layout(rows: Sequence[Row]) -> list[Panel]:
    """Place panels left to right, rows top to bottom; each row must fit the 24-column grid."""
    placed: list[Panel] = []
    y = 0
    for height, cells in rows:
        x = 0
        for width, panel in cells:
            placed.append(attr.evolve(panel, gridPos=GridPos(h=height, w=width, x=x, y=y)))
            x += width
        if x > GRID_COLUMNS:
            raise ValueError(f"row at y={y} is {x} columns wide (max {GRID_COLUMNS})")
        y += height
    return placed


def make_dashboard(
    *,
    uid: str,
    title: str,
    description: str,
    rows: Sequence[Row],
    templates: Sequence[Any] | None = None,
    time_from: str = "now-1h",
) -> Dashboard:
    return Dashboard(
        uid=uid,
        title=title,
        description=description,
        tags=[TAG],
        panels=layout(rows),
        templating=Templating(list=list(templates if templates is not None else variables())),
        links=[
            DashboardLink(
                title="fastllm dashboards",
                type="dashboards",
                tags=[TAG],
                asDropdown=True,
                includeVars=True,
                keepTime=True,
            )
        ],
        schemaVersion=SCHEMA_VERSION,
        refresh="30s",
        time=Time(time_from, "now"),
        timezone="utc",
        editable=False,
    ).auto_panel_ids()
