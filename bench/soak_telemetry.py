"""`bench.soak --telemetry`: the soak with the server's telemetry wired in, so leaks in the sinks
show in the same RSS figures: a PrometheusSink and a TracingSink (from `create_monitoring`) on the
engine's fan-out, each request's SERVER span opened before submit (as the server does), and a
/metrics scrape at every memory sample. Spans go to a TracerProvider with no processor (created,
ended and dropped: an exporter that kept them would itself grow the RSS being measured)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from monitoring.tracer_provider import create_tracer_provider
from monitoring.tracing import request_attributes
from monitoring.wiring import Monitoring, create_monitoring
from runtime.config import Settings
from runtime.engine.engine import Engine
from runtime.engine.stats import FanOut


def attach_telemetry(engine: Engine, fanout: FanOut, model_path: Path) -> Monitoring:
    """Add the Prometheus and tracing sinks of a fresh registry to `fanout` (the engine's sink)."""
    config = engine.config
    settings = Settings.model_validate({"model_path": model_path, "model_name": config.model_name})
    monitoring = create_monitoring(
        settings,
        device=str(engine.loaded.device),
        models=[(config.model_name, config.model_version)],
        allocator_stats=engine.allocator_stats,
        utilization=engine.utilization,
        busy_fraction=engine.busy_fraction,
        tracer_provider=create_tracer_provider(environ={}),
    )
    for sink in monitoring.sinks:
        fanout.add(sink)
    return monitoring


def span_starter(monitoring: Monitoring, model: str) -> Callable[[str, int], None]:
    """What the server does at admission: open the request's SERVER span."""

    def start(request_id: str, max_tokens: int) -> None:
        attributes = request_attributes(model=model, max_tokens=max_tokens)
        monitoring.tracing.start_request(request_id, None, attributes)

    return start
