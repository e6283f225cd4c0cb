"""Values the PromQL subset works on. A label set is a sorted tuple of (name, value) pairs so it
can key dicts; `__name__` is an ordinary label, as in Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from alerts.promql.regex import Pattern, compile_regex

Labels = tuple[tuple[str, str], ...]
METRIC_NAME = "__name__"
# Prometheus' default lookback for instant selectors: the newest sample within 5m counts.
LOOKBACK_S = 300.0


def make_labels(pairs: Mapping[str, str] | Iterable[tuple[str, str]]) -> Labels:
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return tuple(sorted((k, v) for k, v in items if v != ""))


def label_value(labels: Labels, name: str) -> str:
    for key, value in labels:
        if key == name:
            return value
    return ""


def drop_name(labels: Labels) -> Labels:
    return tuple(p for p in labels if p[0] != METRIC_NAME)


@dataclass(frozen=True)
class Matcher:
    """One label matcher; a missing label matches as the empty string (as in Prometheus)."""

    name: str
    op: str  # "=" | "!=" | "=~" | "!~"
    value: str
    _regex: Pattern | None = field(default=None, compare=False, repr=False)

    @classmethod
    def create(cls, name: str, op: str, value: str) -> Matcher:
        regex = compile_regex(value) if op in ("=~", "!~") else None
        return cls(name, op, value, regex)

    def matches(self, labels: Labels) -> bool:
        actual = label_value(labels, self.name)
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        assert self._regex is not None
        # Prometheus anchors regexes at both ends
        found = self._regex.fullmatch(actual) is not None
        return found if self.op == "=~" else not found


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector."""

    labels: Labels
    value: float


@dataclass
class Series:
    """Points of one series in a time range, oldest first. A value of None is a staleness
    marker: the series vanished from its source at that time."""

    labels: Labels
    points: list[tuple[float, float | None]] = field(default_factory=list)


Vector = list[Sample]
Value = float | Vector  # an expression yields a scalar or an instant vector
