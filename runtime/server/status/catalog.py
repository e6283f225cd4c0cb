"""What the status page at `/` draws: every panel of the generated Grafana dashboards
(dashboards/generated/*.json, shipped in the package), in their order, with their own PromQL.

    window = PageWindow.for_evaluator(interval_s=15.0, time_scale=1.0)
    panels = build_catalog(load_generated(), window, rules)    # [PagePanel, ...]

Template variables take their "All" value (`.*`), Grafana's builtins get the page's window
(`$__range` = 1h, `$__rate_interval` as Grafana derives it from the sample interval and step).
The expressions stay in the dashboards' time units: the query endpoint scales them by
`alerts_time_scale`, as the rule evaluator scales the rules, so page and alerts share one clock.

Each panel says why the page cannot draw it instead of going blank: outside the embedded PromQL
subset (the parser's message), or a PostgreSQL panel (Grafana runs those; the page's audit table
reads inference_log itself). A new dashboard panel appears on the page with no change here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from alerts.errors import AlertRuleError
from alerts.promql import format_duration, parse
from alerts.promql.scale import selected_names
from alerts.rules import AlertRule
from dashboards.queries import PROMQL, metric_names, panel_queries, panels

PAGE_RANGE_S = 3600.0  # the page shows the last hour (times alerts_time_scale)
NUM_STEPS = 120  # points per series across the window
DRAWN_KINDS = frozenset({"timeseries", "stat", "bargauge", "table", "state-timeline"})
SQL_NOTE = (
    "PostgreSQL panel: Grafana runs it on inference_log; here the operator-anomaly audit table "
    "answers from the same rows"
)
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


@dataclass(frozen=True)
class PageWindow:
    """The page's time window, in real seconds (already multiplied by the time scale)."""

    range_s: float
    step_s: float
    rate_interval_s: float  # Grafana: max(4 x scrape interval, step + scrape interval)
    time_scale: float

    @classmethod
    def for_evaluator(cls, interval_s: float, time_scale: float) -> PageWindow:
        range_s = PAGE_RANGE_S * time_scale
        step_s = max(range_s / NUM_STEPS, interval_s)
        rate_s = max(4 * interval_s, step_s + interval_s)
        return cls(range_s, step_s, rate_s, time_scale)

    def unscaled(self, seconds: float) -> str:
        """A real duration written in the dashboards' units (the endpoint scales it back)."""
        return format_duration(seconds / self.time_scale)


@dataclass(frozen=True)
class PageTarget:
    ref_id: str
    expr: str  # variables and builtins expanded; durations in dashboard units
    legend: str  # Grafana legendFormat: `{{label}}` placeholders
    instant: bool


@dataclass(frozen=True)
class PagePanel:
    key: str  # "<dashboard>-<panel id>", stable across refreshes
    dashboard: str
    dashboard_title: str
    title: str
    description: str
    kind: str  # Grafana panel type
    width: int  # grid columns of 24
    unit: str
    min_value: float | None
    max_value: float | None
    thresholds: tuple[tuple[float | None, str], ...]  # (from value, colour), first from None
    mappings: Mapping[str, tuple[str, str]]  # value -> (text, colour)
    targets: tuple[PageTarget, ...]
    alert_names: tuple[str, ...]  # rules reading the same metrics (their states shown beside)
    problem: str | None = None  # why the page cannot evaluate it (shown in place of data)
    note: str | None = None  # why the page does not draw it (SQL panels)


def expand(expr: str, window: PageWindow, variables: Iterable[str]) -> str:
    known = set(variables)
    builtins = {
        "__range": window.unscaled(window.range_s),
        "__rate_interval": window.unscaled(window.rate_interval_s),
        "__interval": window.unscaled(window.step_s),
    }

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in builtins:
            return builtins[name]
        return ".*" if name in known else match.group()  # the variables' allValue

    return _VARIABLE.sub(value, expr)


def _problem(targets: Sequence[PageTarget]) -> str | None:
    for target in targets:
        try:
            parse(target.expr)
        except AlertRuleError as exc:
            return f"outside the embedded PromQL subset: {exc.message}"
    return None


def _alerts_for(targets: Sequence[PageTarget], rules: Sequence[AlertRule]) -> tuple[str, ...]:
    names: set[str] = set()
    for target in targets:
        found = selected_names(parse(target.expr)) or set()
        names |= {n for n in found if n not in ("up", "ALERTS")}
    return tuple(r.name for r in rules if names & (selected_names(r.expr) or set()))


def _panel(name: str, board: dict[str, Any], raw: dict[str, Any], **fields: Any) -> PagePanel:
    defaults = raw.get("fieldConfig", {}).get("defaults", {})
    steps = defaults.get("thresholds", {}).get("steps") or []
    mappings: dict[str, tuple[str, str]] = {}
    for mapping in defaults.get("mappings") or []:
        for value, option in (mapping.get("options") or {}).items():
            mappings[str(value)] = (str(option.get("text", value)), str(option.get("color", "")))
    return PagePanel(
        key=f"{name}-{raw['id']}",
        dashboard=name,
        dashboard_title=str(board.get("title", name)),
        title=str(raw.get("title", "")),
        description=str(raw.get("description", "")),
        kind=str(raw.get("type", "")),
        width=int(raw.get("gridPos", {}).get("w", 24)),
        unit=str(defaults.get("unit") or "short"),
        min_value=defaults.get("min"),
        max_value=defaults.get("max"),
        thresholds=tuple((s.get("value"), str(s.get("color", ""))) for s in steps),
        mappings=mappings,
        **fields,
    )


def build_catalog(
    dashboards: Mapping[str, dict[str, Any]], window: PageWindow, rules: Sequence[AlertRule]
) -> list[PagePanel]:
    out: list[PagePanel] = []
    for name, board in dashboards.items():
        variables = [v["name"] for v in board.get("templating", {}).get("list", [])]
        queries = {(q.panel_id, q.ref_id): q for q in panel_queries(name, board)}
        for raw in panels(board):
            if raw.get("type") not in DRAWN_KINDS or not raw.get("targets"):
                continue  # rows, text: no query to show
            mine = [q for (pid, _), q in queries.items() if pid == raw["id"]]
            legends = {
                str(t.get("refId", "")): str(t.get("legendFormat", "")) for t in raw["targets"]
            }
            if any(q.kind != PROMQL for q in mine):
                out.append(_panel(name, board, raw, targets=(), alert_names=(), note=SQL_NOTE))
                continue
            targets = tuple(
                PageTarget(
                    q.ref_id, expand(q.text, window, variables), legends[q.ref_id], q.instant
                )
                for q in mine
            )
            problem = _problem(targets)
            alerts = () if problem else _alerts_for(targets, rules)
            out.append(
                _panel(name, board, raw, targets=targets, alert_names=alerts, problem=problem)
            )
    return out


def dashboard_metric_names(dashboards: Mapping[str, dict[str, Any]]) -> set[str]:
    """Every metric a PromQL panel reads: what the evaluator must sample for the page."""
    names: set[str] = set()
    for name, board in dashboards.items():
        for query in panel_queries(name, board):
            if query.kind == PROMQL:
                names |= metric_names(query.text)
    return names
