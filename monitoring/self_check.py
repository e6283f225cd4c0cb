"""`fastllm_kv_leaked_pages` and `fastllm_allocator_orphan_blocks`: the engines' last idle
self-check (runtime.engine.self_check), read at scrape time. Absent for an engine that has not
been idle yet; the alert `FastllmMemorySelfCheck` fires on any value above 0."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# (model, version, the engine's self_check_result) for each engine
Source = tuple[str, str, Callable[[], Any]]


class SelfCheckCollector(Collector):
    def __init__(self, sources: Sequence[Source]) -> None:
        self.sources = list(sources)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pages = GaugeMetricFamily(
            "fastllm_kv_leaked_pages",
            "KV pages still held when the engine was last idle (0 = every page free or cached).",
            labels=["model", "version"],
        )
        orphans = GaugeMetricFamily(
            "fastllm_allocator_orphan_blocks",
            "Live allocator blocks whose owner no longer existed at the last idle self-check.",
            labels=["model", "version"],
        )
        for model, version, result_of in self.sources:
            result = result_of()
            if result is None:
                continue
            pages.add_metric([model, version], result.leaked_pages)
            orphans.add_metric([model, version], result.orphan_blocks)
        yield pages
        yield orphans
