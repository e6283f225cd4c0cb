"""Tensor parallelism's metric, read at scrape time from the engines (runtime.engine.tp):

    fastllm_tp_worker_restarts_total{model, version}   worker restarts after a worker died
    fastllm_tp_rank_memory_bytes{model, version, rank, type}   per rank: rss, kv_pool, weights

Registered only when `tensor_parallel_size` > 1, so a one-process server's scrape (the metric
contract) is unchanged. A counter built from the world's cumulative count: exact at each scrape,
nothing polls."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

RestartSource = tuple[str, str, Callable[[], int | None]]  # model, version, () -> restarts
# model, version, () -> rows of runtime.engine.tp.world.RankMemory as dicts
MemorySource = tuple[str, str, Callable[[], list[dict[str, Any]] | None]]
MEMORY_TYPES = (("rss", "rss_bytes"), ("kv_pool", "kv_pool_bytes"), ("weights", "weight_bytes"))


class TPRestartsCollector(Collector):
    def __init__(self, sources: list[RestartSource], memory: Sequence[MemorySource] = ()) -> None:
        self.sources = sources
        self.memory = list(memory)

    def describe(self) -> Iterable[Metric]:
        return [self._family(), self._memory_family()]

    def collect(self) -> Iterable[Metric]:
        return [self._restarts(), self._memory()]

    def _memory(self) -> Metric:
        family = self._memory_family()
        for model, version, read in self.memory:
            try:
                rows = read() or []
            except Exception:  # a scrape must never fail on one engine
                log.exception("tensor-parallel memory unavailable")
                rows = []
            for row in rows:
                for kind, key in MEMORY_TYPES:
                    if row.get(key) is not None:
                        family.add_metric([model, version, str(row["rank"]), kind], row[key])
        return family

    @staticmethod
    def _memory_family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "fastllm_tp_rank_memory_bytes",
            "Per tensor-parallel rank: process RSS, KV pool and weight bytes.",
            labels=["model", "version", "rank", "type"],
        )

    def _restarts(self) -> Metric:
        family = self._family()
        for model, version, read in self.sources:
            try:
                value = read()
            except Exception:  # a scrape must never fail on one engine
                log.exception("tensor-parallel restarts unavailable")
                value = None
            if value is not None:
                family.add_metric([model, version], float(value))
        return family

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "fastllm_tp_worker_restarts",
            "Tensor-parallel worker restarts after a worker died (its live requests got 503).",
            labels=["model", "version"],
        )
