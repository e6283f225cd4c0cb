"""One soak run in this process: N generation requests through the tiny llama on the Engine, with
memory sampled between engine steps. `bench.soak` runs it once pooled and once unpooled, each in
its own subprocess (RSS is per process).

Pure helpers (`fluctuation_pct`, `growth_pct`, `summarize`) are tested in tests/bench/.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from bench.serving import greedy
from bench.serving_parts import make_workload
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest, RequestHandle
from runtime.engine.stats import AllocatorStats, FanOut, RequestStats, StepStats, VerificationResult
from runtime.memory import Allocator, AllocatorConfig

PROMPT_LENS = (8, 512)  # tokens, inclusive
NEW_TOKENS = (1, 64)
MAX_BATCH = 48  # requests submitted together: uniform in [1, MAX_BATCH]
WARMUP_FRACTION = 0.1
UNPOOLED = AllocatorConfig(small_blocks_per_class=0, medium_cache_bytes=0)  # plain torch alloc


@dataclass(frozen=True)
class MemorySample:
    num_requests: int  # requests finished when sampled
    rss_bytes: int
    bytes_in_use: int  # allocator: live blocks
    footprint_bytes: int  # allocator: in use + cached (what the pools hold from the OS)
    live_blocks: int


@dataclass(frozen=True)
class SoakFigures:
    requests: int
    rss_fluctuation_pct: float
    rss_growth_pct: float
    allocator_fluctuation_pct: float  # of the footprint (in use + cached)
    allocator_growth_pct: float
    live_blocks_after_drain: int
    leaks: int  # allocator blocks reclaimed by the finaliser (dropped unreleased)
    failed_requests: int
    seconds: float  # wall clock of the workload
    cpu_seconds: float  # process CPU time of the workload (all threads)
    kv_pages_held_after_drain: int = 0  # pages some sequence still held once all finished


def fluctuation_pct(values: Sequence[float]) -> float:
    """Largest deviation from the mean, in % of the mean."""
    mean = statistics.fmean(values)
    return 0.0 if mean == 0 else 100.0 * max(abs(v - mean) for v in values) / mean


def growth_pct(values: Sequence[float], fraction: float = 0.1) -> float:
    """Mean of the last `fraction` of the values vs the mean of the first, in %."""
    k = max(1, round(len(values) * fraction))
    first, last = statistics.fmean(values[:k]), statistics.fmean(values[-k:])
    return 0.0 if first == 0 else 100.0 * (last - first) / first


def after_warmup(samples: Sequence[MemorySample], num_requests: int) -> list[MemorySample]:
    cut = num_requests * WARMUP_FRACTION
    return [s for s in samples if s.num_requests > cut]


class SamplingSink:
    """A StatsSink that samples memory every `interval` finished requests. It runs on the engine
    thread after a step's update and before the next schedule: between steps, no forward live."""

    def __init__(self, interval: int, on_sample: Callable[[], object] | None = None) -> None:
        self.interval = interval
        self.on_sample = on_sample  # e.g. a /metrics scrape (--telemetry)
        self.samples: list[MemorySample] = []
        self.num_finished = 0
        self.num_failed = 0
        self._next_at = interval
        self._process = psutil.Process()

    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None:
        self.num_finished += len(finished)
        self.num_failed += sum(r.failure_reason is not None for r in finished)
        if step is None or step.allocator is None or self.num_finished < self._next_at:
            return
        if self.on_sample is not None:
            self.on_sample()
        self.samples.append(sample(self.num_finished, self._process, step.allocator))
        last = self.samples[-1]
        print(  # progress: a long soak runs for an hour
            f"soak: {last.num_requests} requests, RSS {last.rss_bytes / 2**20:.1f} MiB, "
            f"live blocks {last.live_blocks}",
            file=sys.stderr,
            flush=True,
        )
        while self._next_at <= self.num_finished:
            self._next_at += self.interval


def sample(num_requests: int, process: psutil.Process, stats: AllocatorStats) -> MemorySample:
    return MemorySample(
        num_requests=num_requests,
        rss_bytes=process.memory_info().rss,
        bytes_in_use=stats.bytes_in_use,
        footprint_bytes=stats.bytes_in_use + stats.bytes_cached,
        live_blocks=stats.live_blocks,
    )


def describe_policy(config: EngineConfig) -> str:
    p = config.batch_policy
    return f"band {p.min_util}-{p.max_util}, limit {p.min_batch}..{p.max_batch} from {p.initial}"


def drive(
    engine: Engine,
    num_requests: int,
    *,
    vocab_size: int,
    seed: int,
    on_submit: Callable[[str, int], None] | None = None,
) -> None:
    """Batches of 1..MAX_BATCH requests; batch b+1 is submitted before batch b is awaited, so
    the engine never idles and the running mix keeps changing. Prompts are drawn per batch (a
    100k-request workload held up front would itself grow the RSS being measured).
    `on_submit(request_id, max_tokens)` runs just before each submit (the server's span start)."""
    rng = random.Random(seed)
    done = batch_index = 0
    pending: list[RequestHandle] = []
    while done < num_requests or pending:
        handles: list[RequestHandle] = []
        if done < num_requests:
            k = min(rng.randint(1, MAX_BATCH), num_requests - done)
            work = make_workload(
                k,
                quick=False,
                seed=seed * 1_000_003 + batch_index,
                prompt_lens=PROMPT_LENS,
                new_tokens=NEW_TOKENS,
                vocab_size=vocab_size,
            )
            for j, (prompt, n) in enumerate(zip(work.prompts, work.new_tokens, strict=True)):
                request = GenerationRequest(f"s{done + j}", prompt, greedy(n))
                if on_submit is not None:
                    on_submit(request.request_id, n)
                handles.append(engine.submit(request))
            done, batch_index = done + k, batch_index + 1
        for handle in pending:
            for _ in handle:  # drain the stream; never raises (errors are counted by the sink)
                pass
        pending = handles


def run_soak(
    model_path: Path,
    num_requests: int,
    *,
    pooled: bool,
    interval: int,
    seed: int = 0,
    telemetry: bool = False,
) -> tuple[list[MemorySample], SoakFigures]:
    allocator = Allocator(AllocatorConfig() if pooled else UNPOOLED, device="cpu")
    sink = SamplingSink(interval)
    # the default batch policy (the adaptive controller, band 0.6-0.8, limit 1..64 from 16)
    config = EngineConfig(model_path=model_path, model_name="tiny", device="cpu")
    print(f"policy: defaults ({describe_policy(config)})", file=sys.stderr, flush=True)
    fanout = FanOut([sink])
    engine = Engine(config, fanout, allocator=allocator)
    engine.load()
    on_submit, monitoring = None, None
    if telemetry:
        from bench.soak_telemetry import attach_telemetry, span_starter

        monitoring = attach_telemetry(engine, fanout, model_path)
        sink.on_sample, on_submit = monitoring.render, span_starter(monitoring, config.model_name)
    start, cpu_start = time.perf_counter(), time.process_time()
    drive(
        engine,
        num_requests,
        vocab_size=engine.loaded.args.vocab_size,
        seed=seed,
        on_submit=on_submit,
    )
    engine.shutdown(drain_timeout_s=30)
    pages_held = engine.kv_cache_stats().num_used_pages  # before the pool itself went back
    if monitoring is not None:
        monitoring.shutdown()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    allocator.collect()
    final = allocator.stats()
    return sink.samples, summarize(
        sink.samples,
        num_requests,
        live_blocks_after_drain=final.live_blocks,
        leaks=sum(t.leaks for t in final.tiers),
        failed_requests=sink.num_failed,
        seconds=seconds,
        cpu_seconds=cpu_seconds,
        kv_pages_held_after_drain=pages_held,
    )


def summarize(
    samples: Sequence[MemorySample],
    num_requests: int,
    *,
    live_blocks_after_drain: int,
    leaks: int,
    failed_requests: int,
    seconds: float,
    cpu_seconds: float = 0.0,
    kv_pages_held_after_drain: int = 0,
) -> SoakFigures:
    kept = after_warmup(samples, num_requests)
    if len(kept) < 2:
        raise ValueError(f"need >= 2 samples after warm-up, got {len(kept)}")
    rss = [float(s.rss_bytes) for s in kept]
    footprint = [float(s.footprint_bytes) for s in kept]
    return SoakFigures(
        requests=num_requests,
        rss_fluctuation_pct=round(fluctuation_pct(rss), 3),
        rss_growth_pct=round(growth_pct(rss), 3),
        allocator_fluctuation_pct=round(fluctuation_pct(footprint), 3),
        allocator_growth_pct=round(growth_pct(footprint), 3),
        live_blocks_after_drain=live_blocks_after_drain,
        leaks=leaks,
        failed_requests=failed_requests,
        seconds=round(seconds, 1),
        cpu_seconds=round(cpu_seconds, 1),
        kv_pages_held_after_drain=kv_pages_held_after_drain,
    )


def to_json(samples: Sequence[MemorySample], figures: SoakFigures) -> dict[str, object]:
    return {"figures": asdict(figures), "samples": [asdict(s) for s in samples]}
