"""Adaptive batching against the best pinned limit: the `small` llama through the real server.

    python -m bench.batching [--quick] [--device cpu|cuda] [--cache-dir DIR]

Load: closed-loop streams (32 and 64), each a streamed completion of a 40-token prompt and 64
new tokens (`ignore_eos`), the next sent when the last ends; /metrics scraped every second for
the limit, u and the busy ratio. In one run:
1. pinned limits 1, 2, 4, ..., 64 (min = max = initial = L) under both loads: the best pinned
   throughput per load, its TPOT p50;
2. the defaults (band 0.6-0.8, limit 1..64 from 16): the 32-stream load, then the 64-stream one
   on the same server; utilization_at_steady_state (median u over the second half) inside the
   band, throughput_ratio_vs_best_pinned in [0.6, 0.8], tpot_p50_ratio_vs_best_pinned < 1 (the
   band trades some throughput for shorter steps), settle_intervals, limit_changes_per_min
   (their design: 0.6-0.8 of the best pinned throughput);
3. the throughput goal (`batch_goal` throughput, band 0.9-1.0, via the settings):
   throughput_ratio_vs_best_pinned >= 0.9;
4. open-loop Poisson arrivals at half the best throughput, on the defaults and on the best pinned
   limit: the adaptive limit must not ratchet (end at a bound it moved to) and its TTFT p50 must
   be within 10% of the pinned one's.
Each server is a fresh `fastllm serve` (its load-time warm-up included) except that phases 2 and 3
run their loads one after the other on one server, as a load change would. Throughput, TPOT and
TTFT come from the server's own series (fastllm_batch_size_sum/_count, the TPOT and TTFT
histograms) between scrapes in the measured window. --quick: the 32-stream load only, pinned
limits 4, 16, 64, shorter windows; --limits 4,8,16,32,64 picks the sweep, --no-poisson skips
phase 4. Every pinned row also has `true_ratio` (its tokens/s ÷ the best pinned tokens/s of that
load) and `u` (the median fastllm_device_utilization_ratio over its window): u must read the true
ratio (±0.1, issue 28) and ≥ 0.85 at the best pinned limit. The last line is one JSON object with
these keys and the limit/utilization traces.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.batching_parts import (
    NEW_TOKENS,
    Scrape,
    Server,
    closed_loop,
    open_loop,
    scrape_loop,
    settle_stats,
    start_server,
    trace_of,
    window_stats,
)

DEFAULT_CACHE = Path(os.environ.get("FASTLLM_BENCH_CACHE", "/tmp/fastllm-bench"))
INTERVAL_S = 1.0  # the default control_interval_s
PHASE_GAP_S = 5.0
DEFAULTS_RATIO = (0.6, 0.8)  # the defaults' band, as a share of the best pinned throughput
TARGETS = {
    "throughput_goal": 0.9,
    "u_at_best_pinned": 0.85,
    "u_error": 0.1,
    "poisson_ttft_ratio": 1.1,
}


def pinned(limit: int) -> dict[str, str]:
    return {f"FASTLLM_{k}_NUM_SEQS": str(limit) for k in ("MIN", "MAX", "INITIAL")}


async def _scraped(server: Server, load: Any) -> tuple[list[Scrape], float, Any]:
    scrapes: list[Scrape] = []
    stop = asyncio.Event()
    scraper = asyncio.ensure_future(scrape_loop(server.url, stop, scrapes))
    t0 = time.perf_counter()
    result = await load
    stop.set()
    await scraper
    return scrapes, t0, result


def measure(server: Server, model: str, streams: int, seconds: float, warm_s: float):
    """One closed-loop load; the window [warm_s, seconds] from the server's series."""
    scrapes, t0, _ = asyncio.run(_scraped(server, closed_loop(server.url, model, streams, seconds)))
    stats: dict[str, Any] = window_stats(scrapes, t0 + warm_s, t0 + seconds)
    stats.pop("ttft_p50_s")  # closed loop: TTFT is mostly queueing behind the streams
    us = [s.gauges["u"] for s in scrapes if t0 + warm_s <= s.t and s.gauges.get("u", -1.0) >= 0]
    stats["u"] = round(statistics.median(us), 3) if us else None
    return {**stats, "trace": trace_of(scrapes, t0)}


def poisson(server: Server, model: str, rate: float, seconds: float) -> dict[str, Any]:
    # a closed loop before ends by cancelling its streams: let the server record those first,
    # or their queueing TTFTs land in this window's histogram
    time.sleep(PHASE_GAP_S)
    load = open_loop(server.url, model, rate, seconds)
    scrapes, t0, sent = asyncio.run(_scraped(server, load))
    stats = window_stats(scrapes, t0, float("inf"))
    limits = [s.gauges["limit"] for s in scrapes if "limit" in s.gauges]
    return {
        "ttft_p50_s": stats["ttft_p50_s"],
        "tokens_per_s": stats["tokens_per_s"],
        "requests": sent,
        "limit_first": limits[0] if limits else None,
        "limit_last": limits[-1] if limits else None,
        "limit_range": [min(limits), max(limits)] if limits else None,
        "trace": trace_of(scrapes, t0),
    }


def run(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    # --quick: the 32-stream load only and three pinned limits, so it fits a loaded machine
    loads = (32,) if args.quick else (32, 64)
    limits: tuple[int, ...] = (4, 16, 64) if args.quick else (1, 2, 4, 8, 16, 32, 64)
    if args.limits:
        limits = tuple(int(x) for x in args.limits.split(","))
    pin_s, adapt_s, poisson_s, warm_s = (20, 40, 30, 8) if args.quick else (40, 90, 90, 15)
    if args.short:  # both loads, shorter windows: a shared machine's budget
        pin_s, adapt_s, warm_s = 24, 50, 8
    name = model.name
    report: dict[str, Any] = {"quick": args.quick, "device": args.device, "loads": list(loads)}

    def serve(policy: dict[str, str]) -> Server:
        print(f"policy: {policy or 'defaults'}", file=sys.stderr, flush=True)
        return start_server(str(model), args.device, policy)

    sweep: dict[int, dict[int, dict[str, Any]]] = {s: {} for s in loads}
    for limit in limits:
        server = serve(pinned(limit))
        try:
            for streams in loads:
                result = measure(server, name, streams, pin_s, warm_s)
                result.pop("trace")
                sweep[streams][limit] = result
                print(f"pinned {limit}, {streams} streams: {result}", file=sys.stderr, flush=True)
        finally:
            server.stop()
    best = {s: max(sweep[s], key=lambda k: sweep[s][k]["tokens_per_s"] or 0.0) for s in loads}
    for s in loads:  # the truth u estimates: tokens/s over the best pinned tokens/s, same load
        top = sweep[s][best[s]]["tokens_per_s"] or 0.0
        for row in sweep[s].values():
            row["true_ratio"] = round((row["tokens_per_s"] or 0.0) / top, 3) if top else None
    report["pinned"] = {str(s): {str(k): v for k, v in sweep[s].items()} for s in loads}
    report["best_pinned_limit"] = {str(s): best[s] for s in loads}

    def adaptive(policy: dict[str, str], tag: str, with_poisson: float | None) -> None:
        server = serve(policy)
        out: dict[str, Any] = {"policy": policy or "defaults"}
        try:
            for streams in loads:
                result = measure(server, name, streams, adapt_s, adapt_s / 2)
                ref = sweep[streams][best[streams]]
                result.update(settle_stats(result["trace"], INTERVAL_S))
                result["utilization_at_steady_state"] = result.pop("utilization")
                for key, out_key in (
                    ("tokens_per_s", "throughput_ratio_vs_best_pinned"),
                    ("tpot_p50_s", "tpot_p50_ratio_vs_best_pinned"),
                    ("step_interval_s", "step_interval_ratio_vs_best_pinned"),
                ):
                    if result[key] and ref[key]:
                        result[out_key] = round(result[key] / ref[key], 3)
                out[str(streams)] = result
                brief = {k: v for k, v in result.items() if k != "trace"}
                print(f"{tag}, {streams} streams: {brief}", file=sys.stderr, flush=True)
            if with_poisson is not None:
                out["poisson"] = poisson(server, name, with_poisson, poisson_s)
        finally:
            server.stop()
        report[tag] = out

    best_tps = max(sweep[s][best[s]]["tokens_per_s"] or 0.0 for s in loads)
    rate = 0.5 * best_tps / NEW_TOKENS  # requests per second
    report["poisson_rate_per_s"] = round(rate, 3)
    adaptive({}, "defaults", None if args.no_poisson else rate)
    adaptive({"FASTLLM_BATCH_GOAL": "throughput"}, "throughput_goal", None)
    if not args.no_poisson:
        server = serve(pinned(best[loads[0]]))
        try:
            report["poisson_best_pinned"] = poisson(server, name, rate, poisson_s)
        finally:
            server.stop()
    return report


def verdict(report: dict[str, Any]) -> dict[str, bool]:
    checks: dict[str, bool] = {}
    for s in map(str, report["loads"]):
        d, goal = report["defaults"][s], report["throughput_goal"][s]
        u = d["utilization_at_steady_state"]
        checks[f"defaults_{s}_u_in_band"] = u is not None and 0.6 <= u <= 0.8
        lo, hi = DEFAULTS_RATIO
        checks[f"defaults_{s}_throughput"] = (
            lo <= d.get("throughput_ratio_vs_best_pinned", 0.0) <= hi
        )
        checks[f"defaults_{s}_tpot"] = d.get("tpot_p50_ratio_vs_best_pinned", 9.0) < 1.0
        checks[f"throughput_goal_{s}_throughput"] = (
            goal.get("throughput_ratio_vs_best_pinned", 0.0) >= TARGETS["throughput_goal"]
        )
        rows = report["pinned"][s]
        top = rows[str(report["best_pinned_limit"][s])]
        checks[f"pinned_{s}_u_at_best"] = (top["u"] or 0.0) >= TARGETS["u_at_best_pinned"]
        checks[f"pinned_{s}_u_reads_true_ratio"] = all(
            r["u"] is not None and abs(r["u"] - r["true_ratio"]) <= TARGETS["u_error"]
            for r in rows.values()
        )
    if "poisson_best_pinned" not in report:
        return checks
    mine, ref = report["defaults"]["poisson"], report["poisson_best_pinned"]
    # a ratchet: the limit ran off to a bound (1 or 64) it did not start at
    checks["poisson_no_ratchet"] = not (
        mine["limit_last"] in (1, 64) and mine["limit_last"] != mine["limit_first"]
    )
    ratio = None
    if mine["ttft_p50_s"] and ref["ttft_p50_s"]:
        ratio = round(mine["ttft_p50_s"] / ref["ttft_p50_s"], 3)
    report["poisson_ttft_p50_ratio_vs_best_pinned"] = ratio
    checks["poisson_ttft"] = ratio is not None and ratio <= TARGETS["poisson_ttft_ratio"]
    return checks


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 pinned limits, shorter runs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--limits", default=None, help="pinned limits, e.g. 4,8,16,32,64")
    parser.add_argument("--no-poisson", action="store_true", help="skip the open-loop phase")
    parser.add_argument("--short", action="store_true", help="both loads, shorter windows")
    args = parser.parse_args(argv)
    from bench.http import ensure_model

    model = ensure_model(None, args.cache_dir)
    start = time.perf_counter()
    report = run(args, model)
    checks = verdict(report)
    report["checks"] = checks
    report["meets_targets"] = all(checks.values())
    report["seconds"] = round(time.perf_counter() - start, 1)
    for s in map(str, report["loads"]):
        print(f"pinned, {s} streams: limit  tokens/s  true_ratio  u", file=sys.stderr)
        for limit, row in report["pinned"][s].items():
            print(
                f"  {limit:>5}  {row['tokens_per_s']}  {row['true_ratio']}  {row['u']}",
                file=sys.stderr,
            )
    for key in ("defaults", "throughput_goal"):
        summary = {
            s: {k: v for k, v in report[key][s].items() if k != "trace"}
            for s in map(str, report["loads"])
        }
        print(f"{key}: {json.dumps(summary)}", file=sys.stderr)
    missed = [k for k, ok in checks.items() if not ok]
    if missed:
        print(f"outside target: {', '.join(missed)}", file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
