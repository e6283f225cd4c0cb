"""Alerts: what is pending or firing now, since when, and the runbook for each alert.

The runbook table is generated from the rule files (alerts/rules/*.yml), so a new or renamed alert
makes `fastllm dashboards check` report the JSON as stale until it is rebuilt.
"""

from pathlib import Path

import yaml
from grafanalib.core import Stat, StateTimeline, Table, Text

from dashboards.common import GRAFANA, PROMETHEUS, make_dashboard, or_zero, prom, variables

RULES_DIR = Path(__file__).resolve().parent.parent / "alerts" / "rules"
# 2 = firing, 1 = pending (an alert that is firing is not also shown as pending)
STATE_EXPR = (
    'max by (alertname) (ALERTS{alertstate="firing"}) * 2 '
    'or max by (alertname) (ALERTS{alertstate="pending"})'
)
STATE_MAPPINGS = [
    {
        "type": "value",
        "options": {
            "1": {"text": "pending", "color": "yellow", "index": 0},
            "2": {"text": "firing", "color": "red", "index": 1},
        },
    }
]


def runbook_markdown(rules_dir: Path = RULES_DIR) -> str:
    lines = [
        "Each alert's runbook (docs/runbooks.md) says what it means, what to check first and how "
        "to fix it.",
        "",
        "| alert | severity | for | runbook |",
        "|---|---|---|---|",
    ]
    for path in sorted(rules_dir.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                url = rule.get("annotations", {}).get("runbook_url", "")
                severity = rule.get("labels", {}).get("severity", "")
                lines.append(
                    f"| {rule['alert']} | {severity} | {rule.get('for', '0s')} | "
                    f"[{url.rpartition('/')[2] or 'runbook'}]({url}) |"
                )
    return "\n".join(lines)


def count(state: str, color: str) -> Stat:
    return Stat(
        color={"mode": "thresholds"},
        title=f"{state.capitalize()} alerts",
        dataSource=PROMETHEUS,
        targets=[prom(or_zero(f'count(ALERTS{{alertstate="{state}"}})'), instant=True)],
        reduceCalc="lastNotNull",
        noValue="0",
        colorMode="background",
        graphMode="none",
        thresholds=[{"color": "green", "value": None}, {"color": color, "value": 1}],
    )


dashboard = make_dashboard(
    uid="fastllm-alerts",
    title="fastllm / Alerts",
    description="Alert states from Prometheus (ALERTS series) and links to the runbooks.",
    templates=variables(),
    rows=[
        (
            4,
            [(6, count("firing", "red")), (6, count("pending", "yellow"))],
        ),
        (
            9,
            [
                (
                    12,
                    StateTimeline(
                        title="Alert states over time",
                        description="Pending = condition true, waiting out its `for:`; firing = "
                        "sent to Alertmanager.",
                        dataSource=PROMETHEUS,
                        targets=[prom(STATE_EXPR, "{{alertname}}")],
                        mappings=STATE_MAPPINGS,
                        colorMode="fixed",
                    ),
                ),
                (
                    12,
                    Table(
                        title="Active alerts",
                        description="Every pending or firing instance with its labels.",
                        dataSource=PROMETHEUS,
                        targets=[
                            prom(
                                "max by (alertname, alertstate, severity, instance) (ALERTS)",
                                instant=True,
                                table=True,
                            )
                        ],
                    ),
                ),
            ],
        ),
        (
            10,
            [
                (
                    24,
                    Text(
                        title="Runbooks",
                        dataSource=GRAFANA,
                        content=runbook_markdown(),
                    ),
                )
            ],
        ),
    ],
)
