"""Pieces of bench.telemetry: the instrumented engine and one timed round of the workload.

Besides the round's process CPU time, the CPU spent in telemetry code itself is counted per
thread: the engine thread inside the sinks' `record`, the caller inside `start_request`, the flush
and the scrape, and the span processor's own worker thread. On a shared machine that attribution
is far steadier than the difference of two noisy end-to-end rounds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench.serving import greedy
from bench.serving_parts import make_workload
from monitoring.tracer_provider import create_tracer_provider
from monitoring.tracing import request_attributes
from monitoring.wiring import Monitoring, create_monitoring
from runtime.config import Settings
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.stats import FanOut, RequestStats, StepStats, VerificationResult
from runtime.models.loader import LoadedModel

STREAMS = 32
EXPORTER_THREAD_PREFIX = "OtelBatch"  # the BatchSpanProcessor's worker thread


class TimedSink:
    """The engine's sink: forwards to `inner` and adds up the engine thread's CPU time in it."""

    def __init__(self, inner: FanOut) -> None:
        self.inner = inner
        self.cpu_s = 0.0

    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None:
        start = time.thread_time()
        self.inner.record(step=step, finished=finished, verified=verified)
        self.cpu_s += time.thread_time() - start


def thread_cpu_s(name_prefix: str) -> float:
    """CPU seconds used so far by this process's threads whose name starts with `name_prefix`."""
    ids = {t.native_id for t in threading.enumerate() if t.name.startswith(name_prefix)}
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)


@dataclass
class Instrumented:
    """An engine whose stats go to a Prometheus sink and a tracing sink (the server's wiring)."""

    engine: Engine
    monitoring: Monitoring
    provider: TracerProvider
    exporter: InMemorySpanExporter  # the in-process collector
    sink: TimedSink
    num_tokens: int = 0  # generated through this engine, for the counter check

    def metric_samples(self) -> dict[str, float | None]:
        """What the registry counted vs what was generated (they must agree)."""
        value = self.monitoring.registry.get_sample_value(
            "fastllm_generation_tokens_total",
            {"model": self.engine.config.model_name, "version": self.engine.config.model_version},
        )
        return {"generation_tokens_counted": value, "generation_tokens_sent": self.num_tokens}

    def shutdown(self) -> None:
        self.engine.shutdown()
        self.monitoring.shutdown()


def instrument(config: EngineConfig, model_path: Path, loaded: LoadedModel) -> Instrumented:
    """A second engine on the already loaded model, with metrics and tracing on."""
    settings = Settings.model_validate({"model_path": model_path, "model_name": config.model_name})
    provider = create_tracer_provider(environ={})  # no OTLP exporter from the environment
    exporter = InMemorySpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    fanout = FanOut()
    sink = TimedSink(fanout)
    engine = Engine(config, sink, loader=lambda: loaded)
    engine.load()
    monitoring = create_monitoring(
        settings,
        device=str(loaded.device),
        models=[(config.model_name, config.model_version)],
        allocator_stats=engine.allocator_stats,
        utilization=engine.utilization,
        busy_fraction=engine.busy_fraction,
        tracer_provider=provider,
    )
    for s in monitoring.sinks:
        fanout.add(s)
    return Instrumented(engine, monitoring, provider, exporter, sink)


@dataclass(frozen=True)
class RoundResult:
    num_tokens: int
    wall_s: float
    cpu_s: float  # process CPU time, all threads
    num_spans: int  # exported during the round (0 when telemetry is off)
    telemetry_cpu_s: float = 0.0  # of cpu_s, spent in telemetry code (all threads)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.wall_s

    @property
    def cpu_s_per_token(self) -> float:
        return self.cpu_s / self.num_tokens

    @property
    def telemetry_share_pct(self) -> float:
        """Telemetry CPU over the CPU of everything else in the round, in %."""
        return 100.0 * self.telemetry_cpu_s / (self.cpu_s - self.telemetry_cpu_s)


def run_round(engine: Engine, inst: Instrumented | None, tag: str, *, quick: bool) -> RoundResult:
    """The serving workload once, all requests at once; with `inst`, each request's span is
    opened before submit (as the server does) and the round ends with spans flushed and a scrape."""
    vocab_size = min(1000, engine.loaded.args.vocab_size)  # the serving ids, when they fit
    work = make_workload(STREAMS, quick=quick, vocab_size=vocab_size)
    caller_s = 0.0  # this thread's CPU in telemetry calls
    sink_s0 = inst.sink.cpu_s if inst else 0.0
    exporter_s0 = thread_cpu_s(EXPORTER_THREAD_PREFIX) if inst else 0.0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    handles = []
    for i, (prompt, n) in enumerate(zip(work.prompts, work.new_tokens, strict=True)):
        request_id = f"{tag}-{i}"
        if inst is not None:
            t0 = time.thread_time()
            attributes = request_attributes(model=engine.config.model_name, max_tokens=n)
            inst.monitoring.tracing.start_request(request_id, None, attributes)
            caller_s += time.thread_time() - t0
        handles.append(engine.submit(GenerationRequest(request_id, prompt, greedy(n))))
    num_tokens = sum(h.result(timeout=3600).completion_tokens for h in handles)
    num_spans, telemetry_s = 0, 0.0
    if inst is not None:
        # a handle ends before the engine hands that step's stats to the sinks: wait for them
        while inst.monitoring.tracing.num_open:
            time.sleep(0.001)
        t0 = time.thread_time()
        inst.provider.force_flush()
        inst.monitoring.render()
        caller_s += time.thread_time() - t0
        num_spans = len(inst.exporter.get_finished_spans())
        inst.exporter.clear()
        inst.num_tokens += num_tokens
        exporter_s = thread_cpu_s(EXPORTER_THREAD_PREFIX) - exporter_s0
        telemetry_s = caller_s + (inst.sink.cpu_s - sink_s0) + exporter_s
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    return RoundResult(num_tokens, wall_s, cpu_s, num_spans, telemetry_s)
