"""Alert rules (rules/fastllm.rules.yml, tested by promtool), the embedded evaluator that runs
the same rules in-process, and Alertmanager-compatible notifiers."""

from alerts.embedded import build_evaluator, start_embedded
from alerts.evaluator import AlertEvaluator, EvaluatorConfig
from alerts.rules import DEFAULT_RULES_PATH, load_rules
from alerts.state import Alert, Transition

__all__ = [
    "DEFAULT_RULES_PATH",
    "Alert",
    "AlertEvaluator",
    "EvaluatorConfig",
    "Transition",
    "build_evaluator",
    "load_rules",
    "start_embedded",
]
