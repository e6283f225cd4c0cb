"""The `ALERTS` series Prometheus writes for its alerting rules, written by the embedded evaluator
into its own sample store, so queries over alert states (the Alerts dashboard's panels, the
status page) read the same series from either:

    ALERTS{alertname="FastllmMemoryGrowth", alertstate="pending"|"firing", <alert labels>} 1

One point per pending or firing alert per evaluation round; when an alert leaves a state its
series gets a staleness marker, as Prometheus does (a resolved alert has no series).
"""

from __future__ import annotations

from collections.abc import Iterable

from alerts.promql.types import METRIC_NAME, Labels, make_labels
from alerts.state import FIRING, PENDING, Alert
from alerts.store import Point

ALERTS_METRIC = "ALERTS"


class AlertSeries:
    """Turns each round's active alerts into store points (with markers for the ones gone)."""

    def __init__(self) -> None:
        self._previous: set[Labels] = set()

    def points(self, alerts: Iterable[Alert]) -> list[Point]:
        current: set[Labels] = set()
        out: list[Point] = []
        for alert in alerts:
            if alert.state not in (PENDING, FIRING):
                continue
            labels = make_labels(
                {**alert.labels, "alertstate": alert.state, METRIC_NAME: ALERTS_METRIC}
            )
            current.add(labels)
            out.append((labels, 1.0))
        out += [(labels, None) for labels in sorted(self._previous - current)]
        self._previous = current
        return out
