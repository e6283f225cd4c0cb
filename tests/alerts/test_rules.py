"""Conventions of the rule file (monitoring-mixin style) and its contract with the metrics."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from alerts.errors import AlertRuleError
from alerts.promql.scale import selected_names
from alerts.rules import load_rules, parse_rules
from monitoring.metric_names import CONTRACT_METRIC_NAMES, OPTIONAL_METRIC_NAMES

ROOT = Path(__file__).parents[2]
RULES = load_rules()[0].rules
RUNBOOK = (ROOT / "docs" / "runbooks.md").read_text()
EXPECTED = {
    "FastllmMemorySelfCheck",
    "FastllmMemoryGrowth",
    "FastllmDeviceUtilizationLow",
    "FastllmDeviceUtilizationHigh",
    "FastllmOperatorAnomalies",
    "FastllmHighErrorRatio",
    "FastllmQueueSaturation",
    "FastllmKVPreemptions",
    "FastllmInferenceLogDropping",
    "FastllmInferenceLogBacklog",
    "FastllmRuntimeDown",
    "FastllmNotServing",  # issue 39: up, requests waiting, nothing generated
    "FastllmTPWorkerRestarts",  # issue 42: a tensor-parallel worker died and was restarted
}


def _anchors(markdown: str) -> set[str]:
    # GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes
    return {
        re.sub(r"[^\w\- ]", "", m.group(1)).strip().lower().replace(" ", "-")
        for m in re.finditer(r"^#{1,6} (.+)$", markdown, re.MULTILINE)
    }


def test_the_alerts_of_the_issue_exist() -> None:
    assert {r.name for r in RULES} == EXPECTED


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_mixin_conventions(rule) -> None:
    assert re.fullmatch(r"Fastllm(?:[A-Z][a-z0-9]*)+", rule.name)
    assert rule.labels["severity"].source in ("warning", "critical")
    assert set(rule.annotations) == {"summary", "description", "runbook_url"}
    url = rule.annotations["runbook_url"].source
    assert url.split("#")[0].endswith("/docs/runbooks.md")
    assert url.split("#")[1] == rule.name.lower() and url.split("#")[1] in _anchors(RUNBOOK)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_rules_read_only_contract_metrics(rule) -> None:
    names = selected_names(rule.expr)
    # optional names are absent where their source is (a series absent is an alert not firing)
    assert names is not None and names <= {*CONTRACT_METRIC_NAMES, *OPTIONAL_METRIC_NAMES, "up"}


def test_time_scale_shortens_windows_and_for() -> None:
    scaled = {r.name: r for r in load_rules(time_scale=0.01)[0].rules}
    assert scaled["FastllmDeviceUtilizationLow"].for_s == pytest.approx(3.0)
    assert scaled["FastllmMemoryGrowth"].for_s == pytest.approx(6.0)


@pytest.mark.parametrize(
    "document",
    [
        {"groups": [{"name": "g", "rules": [{"record": "x:y", "expr": "x"}]}]},
        {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "1 > 0"}]}]},
        {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up", "for": "5 min"}]}]},
        {
            "groups": [
                {
                    "name": "g",
                    "rules": [
                        {"alert": "A", "expr": "up", "annotations": {"a": "{{ $value | title }}"}}
                    ],
                }
            ]
        },
        {"groups": [{"name": "g"}, {"name": "g"}]},
        {"nope": []},
    ],
)
def test_invalid_rule_documents_are_rejected(document) -> None:
    with pytest.raises(AlertRuleError):
        parse_rules(document)
