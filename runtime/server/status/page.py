"""The status page's server half: the panel catalogue, the query service over the embedded
evaluator's store, and the page's window, built once per app from its ServerState.

    page = StatusPage.from_state(state)      # state.alerts: the evaluator (None: alerts off)
    page.panels                              # [PagePanel, ...] in dashboard order
    page.queries.range(expr, start, end, step)

The evaluator must sample the panels' metrics and keep them for the window; runtime.server.wiring
asks this module for both (`page_metric_names`, `page_retention_s`) when it builds the evaluator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alerts.promql import LOOKBACK_S
from dashboards.build import GENERATED_DIR
from dashboards.queries import load_generated
from runtime.server.state import ServerState
from runtime.server.status.catalog import (
    PAGE_RANGE_S,
    PagePanel,
    PageWindow,
    build_catalog,
    dashboard_metric_names,
)
from runtime.server.status.query import QueryService
from runtime.server.status.query_runner import QueryLimits, QueryRunner

DASHBOARDS_DIR = GENERATED_DIR  # tests point it at a copy with extra panels
# the page reads like an operator would: what is served first, then memory, batching, alerts
PREFERRED_ORDER = ("overview", "memory", "batching", "alerts", "anomalies")


def ordered_dashboards(directory: Path | None = None) -> dict[str, dict[str, Any]]:
    found = load_generated(directory or DASHBOARDS_DIR)
    rank = {name: i for i, name in enumerate(PREFERRED_ORDER)}
    return {name: found[name] for name in sorted(found, key=lambda n: (rank.get(n, 99), n))}


def page_metric_names() -> set[str]:
    return dashboard_metric_names(ordered_dashboards())


def page_retention_s(time_scale: float) -> float:
    """The window, the widest rate window past its start and the lookback, with a margin."""
    return (PAGE_RANGE_S * 1.5 + LOOKBACK_S) * time_scale


@dataclass(frozen=True)
class StatusPage:
    window: PageWindow
    interval_s: float  # the evaluator's sampling interval (real seconds)
    panels: list[PagePanel] = field(default_factory=list)
    dashboards: list[tuple[str, str]] = field(default_factory=list)  # (name, title) in order
    queries: QueryService | None = None  # None: no evaluator, so no store to query
    unavailable: str | None = None  # why queries is None
    runner: QueryRunner | None = None  # the threads and budget queries run with

    @classmethod
    def from_state(cls, state: ServerState) -> StatusPage:
        settings = state.settings
        evaluator = state.alerts
        interval_s = settings.alerts_interval_s
        scale = settings.alerts_time_scale
        window = PageWindow.for_evaluator(interval_s, scale)
        boards = ordered_dashboards()
        rules = [] if evaluator is None else [s.rule for s in evaluator.manager.states]
        panels = build_catalog(boards, window, rules)
        titles = [(name, str(board.get("title", name))) for name, board in boards.items()]
        if evaluator is None:
            why = "the embedded evaluator is off (alerts_enabled=false): no samples to query"
            return cls(window, interval_s, panels, titles, None, why)
        runner = QueryRunner(QueryLimits.from_settings(settings))
        state.on_stop.append(runner.close)  # a stopping server stops its running queries
        lookback_s = evaluator.manager.engine.lookback_s

        def settled() -> float | None:
            return evaluator.settled_ts

        queries = QueryService(evaluator.store, lookback_s, scale, settled)
        return cls(window, interval_s, panels, titles, queries, runner=runner)
