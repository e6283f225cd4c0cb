"""What one app instance holds: settings, the router over its engines, the stats fan-out, the
metrics registry, drain state, and the start/stop hooks of the parts wiring attached.

Routes reach it through `get_state(request)`; nothing here imports a telemetry or storage library
(those hide behind `start_span`, `on_start` and `on_stop`, filled in by runtime.server.wiring).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.requests import Request

from runtime.config import Settings
from runtime.engine.client import EngineClient
from runtime.engine.stats import FanOut
from runtime.server.lifecycle import Drain
from runtime.serving.router import Router

# start_span(request_id, traceparent, attributes) opens the request's SERVER span
SpanStarter = Callable[[str, str | None, Mapping[str, Any]], object]
# request id -> (traceparent, attributes, admission wall time): a span the tracing sink opens
AdmittedSpans = dict[str, tuple[str | None, Mapping[str, Any], float]]


@dataclass(eq=False)
class SpanStarts:
    """A `SpanStarter` that only notes the span (one dict store): the tracing sink opens it, at
    the admission time noted here, on the engine's stats thread (monitoring.tracing), so the
    request loop does no OpenTelemetry work."""

    admitted: AdmittedSpans  # the tracing sink's (it drains it before each record)

    def __call__(self, request_id: str, traceparent: str | None, attributes: Any) -> None:
        self.admitted[request_id] = (traceparent, attributes, time.time())


@dataclass
class ServerState:
    settings: Settings
    router: Router
    stats: FanOut  # the engines' sink; the server records its own refusals here too
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    drain: Drain = field(default_factory=Drain)
    start_span: SpanStarter | None = None
    on_start: list[Callable[[], None]] = field(default_factory=list)  # lifespan start, in order
    on_stop: list[Callable[[], None]] = field(default_factory=list)  # lifespan end, reversed
    after_load: list[Callable[[], None]] = field(default_factory=list)  # every engine loaded
    created: int = field(default_factory=lambda: int(time.time()))
    load_error: str | None = None  # why a model failed to load (the /ready body says so)
    is_loading: bool = False
    monitoring: Any = None  # monitoring.wiring.Monitoring when telemetry is wired
    writer: Any = None  # storage.writer.InferenceLogWriter when storage is wired
    alerts: Any = None  # alerts.evaluator.AlertEvaluator when the embedded evaluator runs
    engines_stopped: bool = False
    tenants: Any = None  # runtime.server.openai.tenancy.TenantCacheTally: prefix hits per tenant

    @property
    def engines(self) -> list[EngineClient]:
        return [engine for _, _, engine in self.router.engines()]

    @property
    def is_ready(self) -> bool:
        engines = self.engines
        return (
            bool(engines)
            and self.load_error is None
            and not self.drain.is_draining
            and all(engine.is_loaded for engine in engines)
        )

    def shutdown_engines(self, drain_timeout_s: float) -> None:
        """Stop every engine (idempotent): in-flight work gets `drain_timeout_s` to finish."""
        if self.engines_stopped:
            return
        self.engines_stopped = True
        for engine in self.engines:
            engine.shutdown(drain_timeout_s)


def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.fastllm
    return state
