"""Where the evaluator's samples come from: the runtime's own prometheus_client registry
(in-process) or any runtime's /metrics over HTTP, parsed with prometheus_client's text parser.
`Sampler` turns one collection into a store round, as a Prometheus scrape does: target labels
(job, instance), an `up` series, and staleness markers for series that vanished."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

import httpx
from prometheus_client import CollectorRegistry, Metric
from prometheus_client.parser import text_string_to_metric_families

from alerts.promql.types import METRIC_NAME, Labels, make_labels
from alerts.store import Point, SampleStore

log = logging.getLogger(__name__)
RawSample = tuple[str, dict[str, str], float]  # name, labels, value


class MetricSource(Protocol):
    instance: str  # the `instance` label of every sample, as a scrape target's

    def collect(self) -> list[RawSample]:
        """Current samples; raises when the source cannot be read (then `up` is 0)."""
        ...


def _flatten(families: Iterable[Metric]) -> list[RawSample]:
    out: list[RawSample] = []
    for family in families:
        for s in family.samples:
            if s.name.endswith("_created"):
                continue  # creation timestamps are not series any rule uses
            out.append((s.name, dict(s.labels), float(s.value)))
    return out


class RegistrySource:
    """Samples of an in-process registry (the serving runtime's own metrics)."""

    def __init__(self, registry: CollectorRegistry, instance: str = "embedded") -> None:
        self.registry = registry
        self.instance = instance

    def collect(self) -> list[RawSample]:
        return _flatten(self.registry.collect())


class UrlSource:
    """Samples scraped from a /metrics URL (Prometheus text format)."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.instance = httpx.URL(url).netloc.decode() or url

    def collect(self) -> list[RawSample]:
        response = httpx.get(self.url, timeout=self.timeout_s)
        response.raise_for_status()
        return _flatten(text_string_to_metric_families(response.text))


class Sampler:
    """One source into one store. `names` limits what is kept to the series the rules read
    (None keeps everything)."""

    def __init__(
        self,
        source: MetricSource,
        store: SampleStore,
        *,
        names: set[str] | None = None,
        job: str = "fastllm",
    ) -> None:
        self.source = source
        self.store = store
        self.names = names
        self.target = {"job": job, "instance": source.instance}
        self._previous: set[Labels] = set()

    def sample(self, t: float) -> bool:
        """Collect once and store the round at time t; returns whether the source was up."""
        try:
            raw = self.source.collect()
            up = True
        except Exception as exc:
            log.warning("cannot collect metrics from %s: %s", self.source.instance, exc)
            raw, up = [], False
        points: list[Point] = []
        for name, labels, value in raw:
            if self.names is not None and name not in self.names:
                continue
            # target labels win, as with Prometheus' honor_labels: false
            points.append((make_labels({**labels, **self.target, METRIC_NAME: name}), value))
        points.append((make_labels({**self.target, METRIC_NAME: "up"}), 1.0 if up else 0.0))
        current = {labels for labels, _ in points}
        points += [(labels, None) for labels in sorted(self._previous - current)]
        self.store.append(t, points)
        self._previous = current
        return up
