from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from monitoring.tracer_provider import create_tracer_provider
from monitoring.tracing import TracingSink, request_attributes
from monitoring.wiring import create_monitoring, package_version
from runtime.config import Settings
from runtime.engine.stats import FanOut
from tests.monitoring import synthetic as syn


class _Receiver(BaseHTTPRequestHandler):
    """A loopback OTLP/HTTP endpoint that keeps what it receives."""

    received: list[tuple[str, bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.server.received.append((self.path, body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(b"")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def otlp_receiver() -> Iterator[HTTPServer]:
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    server.received = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def test_otlp_export_only_when_endpoint_is_set(
    otlp_receiver: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    without = create_tracer_provider(environ={})
    assert without._active_span_processor._span_processors == ()  # no exporter at all
    without.shutdown()

    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{otlp_receiver.server_port}"
    )
    provider = create_tracer_provider(service_name="fastllm-test")
    sink = TracingSink(provider)
    request = syn.finished_request(0, t0=time.time(), prompt_tokens=3, completion_tokens=2)
    sink.start_request(request.request_id, None, request_attributes(model=syn.MODEL))
    sink.record(finished=[request])
    assert provider.force_flush()
    provider.shutdown()

    (path, body), *_ = otlp_receiver.received  # type: ignore[attr-defined]
    assert path == "/v1/traces"
    export = ExportTraceServiceRequest.FromString(body)
    resource = {a.key: a.value.string_value for a in export.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "fastllm-test"
    spans = [s for rs in export.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert [s.name for s in spans] == [f"text_completion {syn.MODEL}"]
    assert [e.name for e in spans[0].events] == ["QUEUED", "SCHEDULED", "FIRST_TOKEN", "FINISHED"]


def test_create_monitoring_wires_build_info_and_sinks() -> None:
    settings = Settings(
        model_name="m", model_version="v1", dtype="bfloat16", trace_sample_ratio=0.5
    )
    mon = create_monitoring(settings, utilization=lambda: 0.42, busy_fraction=lambda: 0.97)
    registry = mon.registry
    labels = {
        "version": package_version(),
        "model": "m",
        "dtype": "bfloat16",
        "device": "cpu",
        "legacy": "false",
    }
    assert registry.get_sample_value("fastllm_build_info", labels) == 1
    assert registry.get_sample_value("fastllm_device_utilization_ratio", {"device": "cpu"}) == 0.42
    assert registry.get_sample_value("fastllm_device_busy_ratio", {"device": "cpu"}) == 0.97
    # GPM exists on CUDA Hopper+ only: on CPU the tensor-activity series is absent, not faked
    assert b"fastllm_device_tensor_active_ratio" not in mon.render()
    # the served (model, version) is visible at zero before any traffic
    zero = {"model": "m", "version": "v1", "endpoint": "chat", "reason": "overloaded"}
    assert registry.get_sample_value("fastllm_request_failure_total", zero) == 0
    fan_out = FanOut(mon.sinks)
    fan_out.record(finished=[syn.rejected_request("x", ts=time.time())])
    assert fan_out.num_sink_errors == 0
    assert b"fastllm_memory_usage" in mon.render()
    mon.shutdown()


def test_registries_are_per_instance() -> None:
    first = create_monitoring(Settings(model_name="a"))
    second = create_monitoring(Settings(model_name="a"))
    first.prometheus.set_steals_source(lambda: 3)
    first.prometheus.record(step=syn.step(1, ts=1.0))
    assert first.registry.get_sample_value("fastllm_scheduler_steals_total") == 3
    assert second.registry.get_sample_value("fastllm_scheduler_steals_total") == 0


def test_asgi_app_serves_the_registry() -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    mon = create_monitoring(Settings(model_name="served"))
    app = FastAPI()
    app.mount("/metrics", mon.asgi_app())
    with TestClient(app) as client:
        response = client.get("/metrics/")
    assert response.status_code == 200
    assert 'fastllm_memory_usage{type="cpu"}' in response.text
    assert 'fastllm_build_info{device="cpu"' in response.text
