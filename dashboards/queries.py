"""Every query in the generated dashboards, with the panel it belongs to.

    for q in all_queries():   # PanelQuery(dashboard, panel_id, panel_title, kind, text, ...)
        ...                   # kind "promql" (Prometheus) or "sql" (PostgreSQL)
    metric_names('rate(fastllm_x_total{a="b"}[5m])')   # {"fastllm_x_total"}

Tests use these to prove each query parses, names only contract metrics and returns data.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dashboards.build import GENERATED_DIR

PROMQL = "promql"
SQL = "sql"
_KIND_BY_DATASOURCE = {"prometheus": PROMQL, "postgres": SQL}


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str  # generated file stem, e.g. "overview"
    panel_id: int
    panel_title: str
    ref_id: str
    kind: str  # PROMQL | SQL
    text: str  # as stored in the JSON: template variables and Grafana macros unexpanded
    datasource_uid: str
    instant: bool = False

    @property
    def where(self) -> str:
        return f"{self.dashboard} / {self.panel_title!r} ({self.ref_id})"


@dataclass(frozen=True)
class VariableQuery:
    dashboard: str
    name: str  # the template variable
    selector: str  # series selector of `label_values(selector, label)`
    label: str


def load_generated(directory: Path = GENERATED_DIR) -> dict[str, dict[str, Any]]:
    """Dashboard file stem -> parsed JSON."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in (collapsed) rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def panel_queries(name: str, dashboard: dict[str, Any]) -> list[PanelQuery]:
    out = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            source = target.get("datasource") or panel.get("datasource") or {}
            uid = source.get("uid", "")
            kind = _KIND_BY_DATASOURCE.get(uid)
            if kind is None:
                raise ValueError(f"{name} / {panel.get('title')!r}: unknown datasource {source}")
            text = target.get("expr") if kind == PROMQL else target.get("rawSql")
            out.append(
                PanelQuery(
                    dashboard=name,
                    panel_id=int(panel["id"]),
                    panel_title=str(panel.get("title", "")),
                    ref_id=str(target.get("refId", "")),
                    kind=kind,
                    text=str(text or ""),
                    datasource_uid=uid,
                    instant=bool(target.get("instant", False)),
                )
            )
    return out


def all_queries(directory: Path = GENERATED_DIR) -> list[PanelQuery]:
    return [q for name, d in load_generated(directory).items() for q in panel_queries(name, d)]


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<selector>.+?)\s*,\s*(?P<label>\w+)\s*\)\s*$")


def variable_queries(directory: Path = GENERATED_DIR) -> list[VariableQuery]:
    """The Prometheus `label_values(...)` query variables of every dashboard."""
    out = []
    for name, dashboard in load_generated(directory).items():
        for variable in dashboard.get("templating", {}).get("list", []):
            if variable.get("type") != "query":
                continue
            query = variable["query"]
            query = query.get("query", "") if isinstance(query, dict) else query
            match = _LABEL_VALUES.match(query)
            if match is None:
                raise ValueError(f"{name}: variable {variable['name']} query {query!r}")
            out.append(VariableQuery(name, variable["name"], match["selector"], match["label"]))
    return out


_KEYWORDS = frozenset(
    [
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "bool",
        "inf",
        "nan",
    ]
)
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.$])[A-Za-z_:][\w:]*")


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (histogram series keep their _bucket/_sum/_count
    suffix). Strings, label matchers, range/subquery brackets, grouping label lists, function
    and aggregation names, keywords and template variables are not metric names."""
    text = _STRINGS.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _LABEL_LISTS.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in _KEYWORDS:
            continue
        names.add(match.group())
    return names
