"""The alerts package's errors (the whole tree is drawn in runtime/errors.py)."""

from __future__ import annotations

from runtime.errors import ConfigError

__all__ = ["AlertRuleError"]


class AlertRuleError(ConfigError):
    """An alert rule file that does not parse, or uses PromQL the embedded evaluator lacks."""
