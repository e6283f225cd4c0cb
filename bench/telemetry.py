"""Cost of telemetry: the serving workload with metrics + tracing on vs off, same run.

    python -m bench.telemetry [--quick] [--rounds N] [--size small|tiny] [--threads N]

Workload: bench.serving's (the `small` llama, 32 concurrent streams; --quick: the short requests;
--size tiny: the tiny llama, whose millisecond steps make telemetry's share a worst case),
all submitted at once and awaited, on two engines sharing one loaded model:
- off: no sink at all (the engine skips even its allocator stats);
- on: a PrometheusSink from `create_monitoring` on a fresh registry plus a TracingSink on a
  TracerProvider whose spans go through a BatchSpanProcessor to an InMemorySpanExporter (the
  in-process collector); each request's SERVER span is opened before `submit`, as the server does.
  The round ends with the spans flushed and one /metrics render (a scrape), both timed.
Rounds are interleaved (off/on, then on/off, ...). Two measures:
- telemetry_overhead_pct (the headline): CPU time spent in telemetry code itself, counted per
  thread (the engine thread inside the sinks, the caller in start_request / flush / scrape, the
  span processor's worker thread), over the CPU time of everything else in the "on" rounds. On a
  shared machine this attribution is steady where end-to-end differences are not;
- end to end: the best round of each mode, as process CPU seconds per generated token
  (e2e_cpu_overhead_pct) and as wall-clock tokens per second (e2e_wall_overhead_pct); these also
  catch indirect costs (GC, cache) but carry the noise of the machine.
Last line: one JSON object (target: telemetry_overhead_pct <= 3).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from bench.telemetry_parts import STREAMS, Instrumented, RoundResult, instrument, run_round
from runtime.engine.engine import Engine, EngineConfig
from runtime.models.demo import make_demo_model

DEFAULT_CACHE = Path(os.environ.get("FASTLLM_BENCH_CACHE", "/tmp/fastllm-bench"))
TARGET_PCT = 3.0


def overhead_pct(off: float, on: float) -> float:
    """How much more the `on` cost is than the `off` cost, in % (costs: lower is better)."""
    return 100.0 * (on - off) / off


def best(results: list[RoundResult]) -> tuple[float, float]:
    """(lowest CPU seconds per token, highest wall tokens per second) over the rounds."""
    return min(r.cpu_s_per_token for r in results), max(r.tokens_per_s for r in results)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short requests, 3 rounds (< 2 min)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per mode (default 5)")
    parser.add_argument("--size", choices=("small", "tiny"), default="small", help="demo llama")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 5)
    torch.set_num_threads(args.threads)
    path = args.cache_dir / f"llama-{args.size}-seed0"
    if not (path / "config.json").is_file():
        print(f"building the {args.size} llama under {path}", file=sys.stderr)
        make_demo_model(path, arch="llama", size=args.size, seed=0, progress=True)

    config = EngineConfig(
        model_path=path,
        model_name=args.size,
        device="cpu",
        max_num_seqs=STREAMS,
        initial_num_seqs=STREAMS,
        min_num_seqs=STREAMS,
        max_num_batched_tokens=1024,
    )
    plain = Engine(config)
    plain.load()
    loaded = plain.loaded
    telemetry: Instrumented = instrument(config, path, loaded)
    results: dict[str, list[RoundResult]] = {"off": [], "on": []}
    for engine, tag in ((plain, "warm-off"), (telemetry.engine, "warm-on")):
        run_round(engine, None if engine is plain else telemetry, tag, quick=True)
    for i in range(rounds):
        order = ("off", "on") if i % 2 == 0 else ("on", "off")
        for mode in order:
            inst = telemetry if mode == "on" else None
            engine = telemetry.engine if mode == "on" else plain
            result = run_round(engine, inst, f"r{i}{mode}", quick=args.quick)
            results[mode].append(result)
            print(
                f"round {i} {mode}: {result.tokens_per_s:.1f} tok/s wall, "
                f"{1e3 * result.cpu_s_per_token:.3f} CPU ms/token, {result.num_spans} spans, "
                f"telemetry {1e3 * result.telemetry_cpu_s:.1f} CPU ms",
                file=sys.stderr,
            )
    plain.shutdown()
    telemetry.shutdown()

    off_cpu, off_tps = best(results["off"])
    on_cpu, on_tps = best(results["on"])
    telemetry_s = sum(r.telemetry_cpu_s for r in results["on"])
    rest_s = sum(r.cpu_s for r in results["on"]) - telemetry_s
    report = {
        "telemetry_overhead_pct": round(100.0 * telemetry_s / rest_s, 3),
        "e2e_cpu_overhead_pct": round(overhead_pct(off_cpu, on_cpu), 3),
        "e2e_wall_overhead_pct": round(overhead_pct(1 / off_tps, 1 / on_tps), 3),
        "telemetry_cpu_ms_per_token": round(
            1e3 * telemetry_s / sum(r.num_tokens for r in results["on"]), 4
        ),
        "off_cpu_ms_per_token": round(1e3 * off_cpu, 4),
        "on_cpu_ms_per_token": round(1e3 * on_cpu, 4),
        "off_tokens_per_s": round(off_tps, 1),
        "on_tokens_per_s": round(on_tps, 1),
        "spans_per_on_round": results["on"][-1].num_spans,
        **telemetry.metric_samples(),
        "rounds": rounds,
        "streams": STREAMS,
        "model": args.size,
        "quick": args.quick,
    }
    if report["telemetry_overhead_pct"] > TARGET_PCT:
        print(f"telemetry overhead above {TARGET_PCT}%", file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
