"""Evaluates every rule of a rule set at one instant and keeps their alert state. Pure and
clock-free: the caller passes the time, so tests drive it with a virtual clock."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from alerts.errors import AlertRuleError
from alerts.promql import LOOKBACK_S, Evaluator
from alerts.rules import RuleGroup
from alerts.state import FIRING, RESOLVED, Alert, RuleState, Transition
from alerts.store import SampleStore

log = logging.getLogger(__name__)


class RuleManager:
    def __init__(self, groups: Sequence[RuleGroup], store: SampleStore) -> None:
        self.groups = list(groups)
        self.store = store
        # the 5m instant-selector lookback is a window too: scaled with the rules' windows
        scale = min((g.time_scale for g in self.groups), default=1.0)
        self.engine = Evaluator(store, lookback_s=LOOKBACK_S * scale)
        self.states = [RuleState(rule) for group in self.groups for rule in group.rules]

    def evaluate(self, t: float) -> list[Transition]:
        """One evaluation round at time `t` (seconds); returns the state changes."""
        transitions: list[Transition] = []
        for state in self.states:
            try:
                vector = self.engine.instant(state.rule.expr, t)
                assert isinstance(vector, list)
                transitions += state.evaluate(vector, t)
            except AlertRuleError as exc:
                # as Prometheus: a failing rule is logged and skipped, the others still run
                log.warning("rule %s failed at %s: %s", state.rule.name, t, exc.message)
        return transitions

    def alerts(self, states: tuple[str, ...] = (FIRING,)) -> list[Alert]:
        return [a for s in self.states for a in s.active(states)]

    def notifiable(self) -> list[Alert]:
        """Snapshots of firing alerts and those resolved recently (Prometheus re-sends both);
        copies, because notifier threads read them while evaluation goes on."""
        return [
            replace(a, labels=dict(a.labels), annotations=dict(a.annotations))
            for a in self.alerts((FIRING, RESOLVED))
        ]

    @property
    def max_window_s(self) -> float:
        return max((g.max_window_s for g in self.groups), default=0.0)

    @property
    def metric_names(self) -> set[str] | None:
        names: set[str] = set()
        for group in self.groups:
            found = group.metric_names
            if found is None:
                return None
            names |= found
        return names
