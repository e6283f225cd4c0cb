"""Loads a Prometheus rule file (the same YAML promtool checks) into parsed alerting rules.
Thresholds live only in the YAML; `time_scale` multiplies every `for:`, range and offset."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from alerts.errors import AlertRuleError
from alerts.promql import ast, parse, parse_duration, scale_durations, type_of
from alerts.promql.scale import max_window_s, selected_names
from alerts.templates import Template

DEFAULT_RULES_PATH = Path(__file__).parent / "rules" / "fastllm.rules.yml"
_RULE_KEYS = frozenset({"alert", "expr", "for", "labels", "annotations", "keep_firing_for"})


@dataclass(frozen=True)
class AlertRule:
    name: str
    expr_text: str
    expr: ast.Expr
    for_s: float = 0.0
    labels: Mapping[str, Template] = field(default_factory=dict)
    annotations: Mapping[str, Template] = field(default_factory=dict)
    group: str = ""


@dataclass(frozen=True)
class RuleGroup:
    name: str
    rules: tuple[AlertRule, ...]
    interval_s: float | None = None  # None: the evaluator's interval
    time_scale: float = 1.0  # already applied to the rules; the evaluator scales its lookback

    @property
    def metric_names(self) -> set[str] | None:
        """Names every rule reads (None: some rule reads a selector without a name)."""
        names: set[str] = set()
        for rule in self.rules:
            found = selected_names(rule.expr)
            if found is None:
                return None
            names |= found
        return names

    @property
    def max_window_s(self) -> float:
        return max((max_window_s(r.expr) for r in self.rules), default=0.0)


def _templates(raw: Any, where: str) -> dict[str, Template]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise AlertRuleError(f"{where}: expected a mapping")
    return {str(k): Template.parse(str(v)) for k, v in raw.items()}


def _rule(raw: Any, group: str, time_scale: float) -> AlertRule:
    if not isinstance(raw, dict):
        raise AlertRuleError(f"group {group}: a rule must be a mapping")
    if "record" in raw:
        raise AlertRuleError(f"group {group}: recording rules are not supported by the evaluator")
    unknown = set(raw) - _RULE_KEYS
    if unknown or "alert" not in raw or "expr" not in raw:
        raise AlertRuleError(f"group {group}: bad rule keys {sorted(unknown) or sorted(raw)}")
    name = str(raw["alert"])
    if "keep_firing_for" in raw:
        raise AlertRuleError(f"{name}: keep_firing_for is not supported by the evaluator")
    try:
        expr = parse(str(raw["expr"]))
        if type_of(expr) != "vector":
            raise AlertRuleError("an alerting expression must return an instant vector")
        for_s = parse_duration(str(raw["for"])) if raw.get("for") else 0.0
    except AlertRuleError as exc:
        raise AlertRuleError(f"{name}: {exc.message}") from exc
    return AlertRule(
        name=name,
        expr_text=str(raw["expr"]).strip(),
        expr=scale_durations(expr, time_scale),
        for_s=for_s * time_scale,
        labels=_templates(raw.get("labels"), f"{name}.labels"),
        annotations=_templates(raw.get("annotations"), f"{name}.annotations"),
        group=group,
    )


def parse_rules(document: Any, *, time_scale: float = 1.0) -> list[RuleGroup]:
    if time_scale <= 0:
        raise AlertRuleError("time_scale must be positive")
    if not isinstance(document, dict) or not isinstance(document.get("groups"), list):
        raise AlertRuleError("a rule file needs a top-level `groups:` list")
    groups: list[RuleGroup] = []
    seen: set[str] = set()
    for raw in document["groups"]:
        name = str(raw.get("name", "")) if isinstance(raw, dict) else ""
        if not name or name in seen:
            raise AlertRuleError(f"rule groups need unique names (got {name!r})")
        seen.add(name)
        interval = raw.get("interval")
        rules = tuple(_rule(r, name, time_scale) for r in raw.get("rules") or [])
        interval_s = parse_duration(str(interval)) * time_scale if interval else None
        groups.append(RuleGroup(name, rules, interval_s, time_scale))
    return groups


def load_rules(path: str | Path | None = None, *, time_scale: float = 1.0) -> list[RuleGroup]:
    """Read and parse a rule file; AlertRuleError names what is wrong."""
    path = Path(path) if path is not None else DEFAULT_RULES_PATH
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise AlertRuleError(f"cannot read rules {path}: {exc}") from exc
    try:
        return parse_rules(document, time_scale=time_scale)
    except AlertRuleError as exc:
        raise AlertRuleError(f"{path}: {exc.message}") from exc
