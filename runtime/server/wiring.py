"""Settings -> a ServerState with every part attached. The one module that imports the runtime,
monitoring, storage and alerts together (see DESIGN.md, dependency direction).

    engines --record()--> FanOut --> PrometheusSink  (metrics_enabled; /metrics serves it)
                                 +-> TracingSink     (tracing_enabled; the server opens spans)
                                 +-> InferenceLogWriter (storage_enabled; database_url)
    alerts: the embedded evaluator when settings.alerts_enabled (and the alerts package has one)

Each part is optional by settings so tests and benchmarks can run light. Parts with threads are
started in the app's lifespan (`on_start`) and stopped, flushing, on the way out (`on_stop`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.config import Settings
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.stats import FanOut
from runtime.models.loader import resolve_device
from runtime.server.openai.tenancy import TenantCacheTally
from runtime.server.state import ServerState, SpanStarts
from runtime.serving.replicas import ReplicaSet
from runtime.serving.router import Router

log = logging.getLogger("fastllm.server")


def build_router(settings: Settings, sink: FanOut) -> Router:
    """The served models: the main one (stable + optional canary) and an optional encoder."""
    router = Router()
    stable: Engine | ReplicaSet
    if settings.num_replicas > 1:  # several engines behind one work-stealing front
        stable = ReplicaSet.from_settings(settings, sink)
    else:
        stable = Engine(EngineConfig.from_settings(settings), sink=sink)
    canary = None
    if settings.canary_model_path is not None:
        config = EngineConfig.from_settings(
            settings,
            model_path=Path(settings.canary_model_path),
            model_version=settings.canary_version,
        )
        canary = Engine(config, sink=sink)
    router.add(
        settings.served_model_name,
        stable=stable,
        stable_version=settings.model_version,
        canary=canary,
        canary_version=settings.canary_version,
        canary_weight=settings.canary_weight,
    )
    for name in settings.lora_modules():  # the engines register them as they load
        router.add_adapter(name, settings.served_model_name)
    if settings.embedding_model_path is not None:
        path = Path(settings.embedding_model_path)
        config = EngineConfig.from_settings(settings, model_path=path, model_name=path.name)
        router.add(path.name, stable=Engine(config, sink=sink), stable_version="stable")
    return router


def build_state(
    settings: Settings, *, make_router: Callable[[FanOut], Router] | None = None
) -> ServerState:
    """`make_router(sink)`: build the engines yourself (tests: custom loaders, fakes); each
    engine must be given `sink`, the fan-out every stats consumer hangs off."""
    configure_request_work(settings)  # before the engines load (their template check renders)
    fanout = FanOut()
    router = (make_router or (lambda sink: build_router(settings, sink)))(fanout)
    state = ServerState(settings=settings, router=router, stats=fanout)
    attach_telemetry(state)
    state.tenants = TenantCacheTally()  # after the metrics sink: nothing delays the counters
    fanout.add(state.tenants)
    if settings.storage_enabled:
        attach_storage(state)
    if settings.verify_sample_rate > 0:
        attach_verification(state)
    if settings.alerts_enabled:
        attach_alerts(state)
    return state


def configure_request_work(settings: Settings) -> None:
    """The chat-template sandbox's limits and the off-loop pool's size, from the settings."""
    from runtime.models.template_sandbox import TemplateLimits, configure_sandbox
    from runtime.server import offload

    configure_sandbox(
        TemplateLimits(
            time_s=settings.chat_template_timeout_s,
            max_output_chars=settings.chat_template_max_output_chars,
            memory_bytes=settings.chat_template_max_memory_bytes,
            num_workers=settings.chat_template_workers,
        )
    )
    offload.configure(settings.offload_workers)


def attach_telemetry(state: ServerState) -> None:
    settings = state.settings
    if not (settings.metrics_enabled or settings.tracing_enabled):
        return
    from monitoring.wiring import create_monitoring
    from runtime.verify.tolerance import anomaly_threshold  # what the anomaly counter counts

    engines = list(state.router.engines())
    primary = engines[0][2]

    def allocator_stats() -> Any:
        return primary.allocator_stats() if primary.is_loaded else None

    monitoring = create_monitoring(
        settings,
        device=str(resolve_device(settings.device)),
        models=[(model, version) for model, version, _ in engines],
        allocator_stats=allocator_stats,
        utilization=primary.utilization,
        busy_fraction=primary.busy_fraction,
        anomaly_threshold=anomaly_threshold(settings),
    )
    if settings.metrics_enabled:
        state.registry = monitoring.registry
        state.stats.add(monitoring.prometheus)
        if monitoring.structured is not None:  # grammar metrics (structured output)
            state.stats.add(monitoring.structured)
        if monitoring.spec is not None:  # speculative decoding's metrics
            state.stats.add(monitoring.spec)
        attach_self_check_metrics(monitoring.registry, engines)
        attach_lora_metrics(state, monitoring.registry, engines)
        if settings.tensor_parallel_size > 1:  # fastllm_tp_worker_restarts_total
            attach_tp_metrics(monitoring.registry, engines)
        sets = [engine for _, _, engine in engines if isinstance(engine, ReplicaSet)]
        if sets:  # fastllm_scheduler_steals_total follows the pools' cumulative steal counts
            monitoring.prometheus.set_steals_source(lambda: sum(s.num_steals for s in sets))
    if settings.tracing_enabled:
        state.stats.add(monitoring.tracing)
        state.start_span = SpanStarts(monitoring.tracing.admitted)  # opened off the request loop
    state.on_stop.append(monitoring.shutdown)
    state.monitoring = monitoring


def attach_lora_metrics(state: ServerState, registry: Any, engines: list[Any]) -> None:
    from monitoring.lora_metrics import attach as attach_lora

    state.stats.add(attach_lora(registry, engines))  # fastllm_lora_* (monitoring.lora_metrics)


def attach_self_check_metrics(registry: Any, engines: list[tuple[str, str, Any]]) -> None:
    from monitoring.self_check import SelfCheckCollector

    none: Callable[[], Any] = lambda: None  # noqa: E731 - an engine without a self-check
    sources = [(m, v, getattr(e, "self_check_result", none)) for m, v, e in engines]
    registry.register(SelfCheckCollector(sources))


def attach_tp_metrics(registry: Any, engines: list[tuple[str, str, Any]]) -> None:
    from monitoring.tp_metrics import TPRestartsCollector

    none: Callable[[], Any] = lambda: None  # noqa: E731 - an engine without workers
    sources = [(m, v, getattr(e, "tp_worker_restarts", none)) for m, v, e in engines]
    memory = [(m, v, getattr(e, "tp_memory", none)) for m, v, e in engines]
    registry.register(TPRestartsCollector(sources, memory))


def attach_verification(state: ServerState) -> None:
    """Sampled requests of every engine are re-checked on the reference path (runtime.verify);
    the probes go through the same fan-out (writer rows, anomaly counter). Registered after the
    writer, so it is closed (its queue finished) before the writer flushes."""
    from runtime.verify.verifier import Verifier

    verifier = Verifier.from_settings(state.settings, state.stats, autostart=False)
    for _, _, engine in state.router.engines():
        engine.verifier = verifier
    state.on_start.append(verifier.start)

    def close() -> None:
        verifier.close(timeout=10.0)

    state.on_stop.append(close)


def attach_storage(state: ServerState) -> None:
    from storage.writer import InferenceLogWriter

    settings = state.settings
    monitoring = state.monitoring
    writer = InferenceLogWriter.from_settings(
        settings,
        on_drop=monitoring.prometheus.on_log_dropped if monitoring is not None else None,
        migrate=True,  # the drain thread applies the migrations before its first write
        autostart=False,
    )
    if monitoring is not None:
        monitoring.prometheus.set_log_queue_source(lambda: writer.num_queued)
    state.stats.add(writer)
    state.on_start.append(writer.start)

    def close_writer() -> None:
        # flushes what is queued, spills what the timeout leaves, then stops the drain thread
        writer.close(timeout=settings.log_close_timeout_s)

    state.on_stop.append(close_writer)
    # last of all (the hooks run in reverse): the evaluator's store shares this engine, and an
    # engine left to the garbage collector leaves its pooled connections open until then
    state.on_stop.insert(0, writer.engine.dispose)
    state.writer = writer


def attach_alerts(state: ServerState) -> None:
    """The embedded evaluator (alerts.embedded) over this app's own registry; samples and alert
    events go to the database when storage is wired (the writer migrates it first), else to
    memory. Started with the app, stopped on the way out."""
    from alerts.embedded import build_evaluator
    from alerts.sources import RegistrySource

    settings = state.settings
    metric_store = None
    if state.writer is not None:
        from storage.store import MetricStore

        metric_store = MetricStore(state.writer.engine)
        # the evaluator's first tick comes at once: migrate before any start hook runs, else it
        # races the writer's drain thread (which still retries when the database is down)
        state.on_start.insert(0, _migrate_quietly(state.writer.engine))
    source = RegistrySource(state.registry, instance=f"{settings.host}:{settings.port}")
    # the status page's panels read the same store: sample their metrics too, and keep them
    # for its window (runtime.server.status.page)
    from runtime.server.status.page import page_metric_names, page_retention_s

    evaluator = build_evaluator(
        settings,
        source,
        metric_store=metric_store,
        extra_names=page_metric_names(),
        min_retention_s=page_retention_s(settings.alerts_time_scale),
    )
    state.on_start.append(evaluator.start)
    state.on_stop.append(evaluator.stop)
    state.alerts = evaluator


def _migrate_quietly(engine: Any) -> Callable[[], None]:
    def migrate() -> None:
        from storage.db import upgrade

        try:
            upgrade(engine)
        except Exception as exc:  # database down at start: the writer's drain thread retries
            log.warning("cannot migrate the database yet: %s", exc)

    return migrate
