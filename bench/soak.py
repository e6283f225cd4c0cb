"""Memory soak: N generation requests through the tiny llama, pooled allocator vs plain torch.

    python -m bench.soak [--requests N] [--quick] [--telemetry] [--threads N] [--cache-dir DIR]
    python -m bench.soak --server [--model DIR] [--requests N] [--samples-out FILE]
        [--setting NAME=VALUE]
    python -m bench.soak --embeddings [--requests N] [--samples-out FILE] [--setting NAME=VALUE]

Workload (fixed seed): prompts of 8–512 tokens, 1–64 new tokens (greedy, never stopping early),
submitted in batches of 1–48 requests, the next batch queued before the previous one is awaited.
Process RSS and the allocator's bytes in use, footprint (in use + cached) and live blocks are
sampled between engine steps every 1,000 finished requests (every N/20 when N < 20,000, as with
--quick, so a short run still gets 20 samples); the first 10% of the requests are warm-up and not
counted. The engine runs the default batch policy (the adaptive controller); its heap trimming
(`heap_trim_interval_s`, 5 s) is on in both modes, as in `fastllm serve`. The same workload runs
twice, each in its own subprocess (RSS is per process) with MALLOC_ARENA_MAX=2: with the tiered
allocator ("pooled") and with pooling off (AllocatorConfig(small_blocks_per_class=0,
medium_cache_bytes=0): every block a plain torch allocation, freed on release) for comparison.
Last line: one JSON object with the pooled figures at the top level and the unpooled ones under
"unpooled". --telemetry wires in the server's Prometheus and tracing sinks, opens a span per
request and scrapes /metrics at every sample (bench.soak_telemetry).
Targets at N = 100,000: RSS fluctuation <= 2%, RSS growth <= 1%, live blocks 0.
--server runs generation through `fastllm serve` instead (bench.soak_server: streaming and not,
client cancellations, shared-prefix hits; --model picks the checkpoint, default the small llama);
--embeddings runs the seed's claim instead: the real MiniLM weights through `fastllm serve` and
/v1/embeddings, the server's RSS sampled (bench.soak_embeddings), with the same RSS targets.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from bench.model_arg import add_model_argument, resolve_model
from bench.soak_run import run_soak, to_json
from runtime.models.demo import make_demo_model

DEFAULT_CACHE = Path(os.environ.get("FASTLLM_BENCH_CACHE", "/tmp/fastllm-bench"))
TARGETS = {
    "rss_fluctuation_pct": 2.0,
    "rss_growth_pct": 1.0,
    "live_blocks_after_drain": 0,
    "kv_pages_held_after_drain": 0,
}
MODES = ("pooled", "unpooled")
SERVER_DRAIN_KEYS = (
    "kv_pages_held_after_drain",
    "kv_leaked_pages_after_drain",
    "allocator_orphan_blocks_after_drain",
)
QUICK_REQUESTS = 1000


def run_child(args: argparse.Namespace, mode: str) -> dict:
    """Run one mode in a fresh interpreter; its last stdout line is the JSON result."""
    cmd = [sys.executable, "-m", "bench.soak", "--child", mode, "--requests", str(args.requests)]
    cmd += ["--interval", str(args.interval), "--threads", str(args.threads)]
    cmd += ["--cache-dir", str(args.cache_dir)] + (["--telemetry"] if args.telemetry else [])
    cmd += ["--model", str(args.model)] if args.model is not None else []
    env = {**os.environ, "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "2")}
    print(f"soak: {mode}, {args.requests} requests ...", file=sys.stderr, flush=True)
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _setting(text: str) -> tuple[str, str]:
    """NAME=VALUE to the server's environment variable: FASTLLM_NAME, VALUE."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return f"FASTLLM_{name.strip().upper()}", value


def print_table(results: dict[str, dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    mib = 1 << 20
    table = Table(title="memory over requests (MiB; * = warm-up, not counted)")
    table.add_column("requests", justify="right")
    for mode in MODES:
        for col in ("RSS", "alloc in use", "alloc footprint", "live blocks"):
            table.add_column(f"{mode} {col}", justify="right")
    rows = zip(*(results[m]["samples"] for m in MODES), strict=False)
    warmup = results["pooled"]["figures"]["requests"] * 0.1
    for samples in rows:
        n = samples[0]["num_requests"]
        cells = [f"{n}{'*' if n <= warmup else ''}"]
        for s in samples:
            cells += [f"{s['rss_bytes'] / mib:.1f}", f"{s['bytes_in_use'] / mib:.2f}"]
            cells += [f"{s['footprint_bytes'] / mib:.2f}", str(s["live_blocks"])]
        table.add_row(*cells)
    Console(file=sys.stdout, width=200).print(table)


def _run_http_soak(args: argparse.Namespace) -> dict:
    if args.embeddings:
        from bench.soak_embeddings import run_embeddings_soak

        return run_embeddings_soak(
            args.requests, args.interval, max_seconds=args.max_seconds, settings=args.setting
        )
    from bench.soak_server import run_server_soak

    # --server's default is the small llama (the engine soak's, the tiny one)
    model = resolve_model(args.model, args.cache_dir)
    if model is None:
        model = args.cache_dir / "llama-small-seed0"
        if not (model / "config.json").is_file():
            print(f"building the small llama under {model}", file=sys.stderr)
            make_demo_model(model, arch="llama", size="small", seed=0)
    return run_server_soak(
        model, args.requests, args.interval, max_seconds=args.max_seconds, settings=args.setting
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=None, help="default 100000 (quick: 1000)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_REQUESTS} requests")
    parser.add_argument("--telemetry", action="store_true", help="with metrics + tracing sinks")
    parser.add_argument(
        "--embeddings", action="store_true", help="MiniLM through the server's /v1/embeddings"
    )
    parser.add_argument(
        "--server",
        action="store_true",
        help="generation through `fastllm serve`: streaming, cancellations, prefix hits",
    )
    parser.add_argument(
        "--samples-out", type=Path, default=None, help="write the RSS samples here (JSON)"
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=float("inf"),
        help="--server/--embeddings: start no request after this long (report what finished)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    add_model_argument(parser)
    parser.add_argument(
        "--interval",
        type=int,
        default=None,
        help="sample RSS every N finished requests (default: requests/20, at most 1000); with "
        "--max-seconds on a slow model give a small one, or no sample may be taken",
    )
    parser.add_argument(
        "--setting",
        type=_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="--server/--embeddings: a server setting (repeatable), e.g. "
        "heap_mmap_threshold_bytes=1048576",
    )
    parser.add_argument("--child", choices=MODES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.setting = dict(args.setting)
    args.requests = args.requests or (QUICK_REQUESTS if args.quick else 100_000)
    if args.interval is None:
        # 1,000 as specified for long runs; N/20 when smaller, so short runs get 20 samples too
        args.interval = max(1, min(1000, args.requests // 20))
    if args.requests < 2 * args.interval:
        parser.error(f"--requests must be >= {2 * args.interval} to give samples past warm-up")
    if args.embeddings or args.server:
        result = _run_http_soak(args)
        report = {**result["figures"], "embeddings": args.embeddings}
        if args.samples_out is not None:
            args.samples_out.write_text(json.dumps(result["samples"]))
        rss_keys = ("rss_fluctuation_pct", "rss_growth_pct")
        missed = [k for k in rss_keys if abs(report[k]) > TARGETS[k]]
        if args.server:
            missed += [k for k in SERVER_DRAIN_KEYS if report[k] > 0]  # -1: not exported
        if missed or report["failed_requests"]:
            print(f"outside target: {', '.join(missed) or 'failed requests'}", file=sys.stderr)
        print(json.dumps(report))
        return
    path = resolve_model(args.model, args.cache_dir) or args.cache_dir / "llama-tiny-seed0"
    if args.child is not None:
        torch.set_num_threads(args.threads)
        samples, figures = run_soak(
            path,
            args.requests,
            pooled=args.child == "pooled",
            interval=args.interval,
            telemetry=args.telemetry,
        )
        print(json.dumps(to_json(samples, figures)))
        return
    if not (path / "config.json").is_file():
        print(f"building the tiny llama under {path}", file=sys.stderr)
        make_demo_model(path, arch="llama", size="tiny", seed=0)
    results = {mode: run_child(args, mode) for mode in MODES}
    print_table(results)
    report = {**results["pooled"]["figures"], "unpooled": results["unpooled"]["figures"]}
    report["telemetry"] = args.telemetry
    missed = [k for k, v in TARGETS.items() if abs(report[k]) > v]
    if missed:
        print(f"outside target: {', '.join(missed)}", file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
