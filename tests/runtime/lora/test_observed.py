"""Adapters observed: the `fastllm_lora_*` metrics (collector over the engines' registries and
the per-adapter requests counter) and the `adapter` column of `inference_log` (migration 0006)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import select
from sqlalchemy.orm import Session

from monitoring.lora_metrics import attach
from runtime.engine.lora import LoraStats
from runtime.engine.stats import RequestStats
from storage.db import make_engine, upgrade
from storage.models import InferenceLog
from storage.writer import InferenceLogWriter
from tests.fixtures.prometheus import check_metrics


class _Engine:
    def __init__(self, stats: LoraStats | None, *, is_loaded: bool = True) -> None:
        self.stats = stats
        self.is_loaded = is_loaded

    def lora_stats(self) -> LoraStats | None:
        if not self.is_loaded:
            raise AssertionError("lora_stats read before the load: it would load the model")
        return self.stats


def test_lora_metrics_from_stats_and_requests() -> None:
    registry = CollectorRegistry()
    stats = LoraStats(
        registered=["a1", "a2", "a3"],
        resident_bytes={"a1": 4096, "a3": 8192},
        loads_total=5,
        evictions_total=2,
        num_loading=1,
    )
    engines = [("llama", "stable", _Engine(stats)), ("llama", "canary", _Engine(None))]
    sink = attach(registry, engines)
    finished = [
        RequestStats("r1", "llama", adapter="a1"),
        RequestStats("r2", "llama", adapter="a1"),
        RequestStats("r3", "llama"),
    ]
    sink.record(finished=finished)
    value = registry.get_sample_value
    labels = {"model": "llama", "version": "stable"}
    assert value("fastllm_lora_adapters", {**labels, "state": "resident"}) == 2
    assert value("fastllm_lora_adapters", {**labels, "state": "loading"}) == 1
    assert value("fastllm_lora_adapter_bytes", {**labels, "adapter": "a3"}) == 8192
    assert value("fastllm_lora_loads_total", labels) == 5
    assert value("fastllm_lora_evictions_total", labels) == 2
    assert value("fastllm_lora_requests_total", {**labels, "adapter": "a1"}) == 2
    assert value("fastllm_lora_requests_total", {**labels, "adapter": ""}) is None
    canary = {"model": "llama", "version": "canary"}
    # a model that can serve no adapters: no sample
    assert value("fastllm_lora_adapters", {**canary, "state": "resident"}) is None
    assert check_metrics(generate_latest(registry).decode()) == []  # promtool's lint


def test_inference_log_adapter_column(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'log.db'}")
    upgrade(engine)  # through 0006
    writer = InferenceLogWriter(engine, batch_size=4, migrate=False)
    for rid, adapter in (("with", "a1"), ("without", None)):
        stats = RequestStats(rid, "llama", adapter=adapter, finished_reason="stop")
        writer.record(finished=[stats])
    assert writer.close(timeout=30)
    with Session(engine) as session:
        stored = {r.request_id: r.adapter for r in session.scalars(select(InferenceLog))}
    engine.dispose()
    assert stored == {"with": "a1", "without": None}


def test_registration_and_scrapes_never_load_the_model() -> None:
    """The collector is registered at wiring time, before the model loads (which may take
    minutes): neither registering nor scraping may read the engine's stats then."""
    registry = CollectorRegistry(auto_describe=True)  # as monitoring.wiring makes it
    attach(registry, [("llama", "stable", _Engine(None, is_loaded=False))])
    generate_latest(registry)
    assert (
        registry.get_sample_value(
            "fastllm_lora_adapters", {"model": "llama", "version": "stable", "state": "resident"}
        )
        is None
    )
