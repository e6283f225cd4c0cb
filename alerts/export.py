"""alerts/rules/*.yml as a prometheus-operator PrometheusRule
(deploy/k8s/base/prometheus-rule.yaml), so Kubernetes runs exactly the rules promtool and the
embedded evaluator are tested on.
`fastllm alerts export --format prometheus-rule` writes it; `--check` names a stale file.

The groups are copied as parsed, in file order (sorted by name); the output is byte-stable
(multi-line expressions and descriptions as YAML block scalars) so the check is a text compare.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from alerts.rules import DEFAULT_RULES_PATH, load_rules

RULES_DIR = DEFAULT_RULES_PATH.parent
HEADER = (
    "# Generated from alerts/rules/*.yml by `fastllm alerts export --format prometheus-rule`;\n"
    "# do not edit (tests/deploy/ fail when it is stale).\n"
)


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as `|` blocks (readable diffs); everything else as safe_dump does."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def rule_files(rules_dir: Path = RULES_DIR) -> list[Path]:
    return sorted(rules_dir.glob("*.yml"))


def rule_groups(rules_dir: Path = RULES_DIR) -> list[dict[str, Any]]:
    """Every group of every rule file, each file validated by the evaluator's parser first."""
    groups: list[dict[str, Any]] = []
    for path in rule_files(rules_dir):
        load_rules(path)  # AlertRuleError for a file the stack could not evaluate
        groups += yaml.safe_load(path.read_text())["groups"]
    return groups


def prometheus_rule(rules_dir: Path = RULES_DIR, name: str = "fastllm") -> str:
    document = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "fastllm"}},
        "spec": {"groups": rule_groups(rules_dir)},
    }
    body = yaml.dump(document, Dumper=_BlockDumper, sort_keys=False, width=100)
    return HEADER + body


def check(path: Path, rules_dir: Path = RULES_DIR) -> list[str]:
    """Problems with `path` (empty: up to date)."""
    hint = f"run `fastllm alerts export --format prometheus-rule --out {path}`"
    if not path.exists():
        return [f"{path}: missing ({hint})"]
    if path.read_text(encoding="utf-8") != prometheus_rule(rules_dir):
        return [f"{path}: stale ({hint})"]
    return []
