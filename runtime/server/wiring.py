"""Settings -> a ServerState with every part attached. The one module that imports the runtime,
monitoring, storage and alerts together (see DESIGN.md, dependency direction).

    engines ──record()──> FanOut ──> PrometheusSink   (metrics_enabled; /metrics serves its registry)
                                 ├─> TracingSink      (tracing_enabled; the server opens each span)
                                 └─> InferenceLogWriter (storage_enabled; settings.database_url)
    alerts: the embedded evaluator when settings.alerts_enabled (and the alerts package has one)

Each part is optional by settings so tests and benchmarks can run light. Parts with threads are
started in the app's lifespan (`on_start`) and stopped, flushing, on the way out (`on_stop`).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.config import Settings
from runtime.engine import Engine, EngineConfig
from runtime.models.loader import resolve_device
from runtime.router import Router
from runtime.server.state import ServerState
from runtime.stats import FanOut

log = logging.getLogger("fastllm.server")


def build_router(settings: Settings, sink: FanOut) -> Router:
    """The served models: the main one (stable + optional canary) and an optional encoder."""
    router = Router()
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
    fanout = FanOut()
    router = (make_router or (lambda sink: build_router(settings, sink)))(fanout)
    state = ServerState(settings=settings, router=router, stats=fanout)
    attach_telemetry(state)
    if settings.storage_enabled:
        attach_storage(state)
    if settings.alerts_enabled:
        attach_alerts(state)
    return state


def attach_telemetry(state: ServerState) -> None:
    settings = state.settings
    if not (settings.metrics_enabled or settings.tracing_enabled):
        return
    from monitoring.wiring import create_monitoring

    engines = list(state.router.engines())
    primary = engines[0][2]

    def allocator_stats() -> Any:
        return primary.allocator_stats() if primary.is_loaded else None

    monitoring = create_monitoring(
        settings,
        device=str(resolve_device(settings.device)),
        models=[(model, version) for model, version, _ in engines],
        allocator_stats=allocator_stats,
        busy_fraction=primary.busy_fraction,
    )
    if settings.metrics_enabled:
        state.registry = monitoring.registry
        state.stats.add(monitoring.prometheus)
    if settings.tracing_enabled:
        state.stats.add(monitoring.tracing)
        tracing = monitoring.tracing

        def start_span(request_id: str, traceparent: str | None, attributes: Any) -> object:
            return tracing.start_request(request_id, traceparent, attributes)

        state.start_span = start_span
    state.on_stop.append(monitoring.shutdown)
    state.monitoring = monitoring


def attach_storage(state: ServerState) -> None:
    from storage.writer import InferenceLogWriter

    settings = state.settings
    monitoring = state.monitoring
    writer = InferenceLogWriter(
        settings.database_url,
        queue_size=settings.log_queue_size,
        batch_size=settings.log_batch_size,
        on_drop=monitoring.prometheus.on_log_dropped if monitoring is not None else None,
        migrate=True,  # the drain thread applies the migrations before its first write
        autostart=False,
    )
    state.stats.add(writer)
    state.on_start.append(writer.start)
    state.on_stop.append(lambda: writer.close(timeout=10.0))
    state.writer = writer


def attach_alerts(state: ServerState) -> None:
    """The alerts package's embedded evaluator: `alerts.evaluator.create_evaluator(settings,
    registry=...)` returning an object with start() and stop(). Absent -> alerts stay off."""
    try:
        module = importlib.import_module("alerts.evaluator")
    except ImportError:
        log.info("the embedded alert evaluator is not available; alerts are off")
        return
    factory = getattr(module, "create_evaluator", None)
    if factory is None:
        log.warning("alerts.evaluator has no create_evaluator(); alerts are off")
        return
    evaluator = factory(state.settings, registry=state.registry)
    state.on_start.append(evaluator.start)
    state.on_stop.append(evaluator.stop)
