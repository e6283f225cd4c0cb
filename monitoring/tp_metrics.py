"""Tensor parallelism's metric, read at scrape time from the engines (runtime.engine.tp):

    fastllm_tp_worker_restarts_total{model, version}   worker restarts after a worker died

Registered only when `tensor_parallel_size` > 1, so a one-process server's scrape (the metric
contract) is unchanged. A counter built from the world's cumulative count: exact at each scrape,
nothing polls."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

RestartSource = tuple[str, str, Callable[[], int | None]]  # model, version, () -> restarts


class TPRestartsCollector(Collector):
    def __init__(self, sources: list[RestartSource]) -> None:
        self.sources = sources

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for model, version, read in self.sources:
            try:
                value = read()
            except Exception:  # a scrape must never fail on one engine
                log.exception("tensor-parallel restarts unavailable")
                value = None
            if value is not None:
                family.add_metric([model, version], float(value))
        return [family]

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "fastllm_tp_worker_restarts",
            "Tensor-parallel worker restarts after a worker died (its live requests got 503).",
            labels=["model", "version"],
        )
