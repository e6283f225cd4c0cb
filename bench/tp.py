"""Tensor parallelism on this machine's CPUs: TP=2 (two processes, one intra-op thread each,
gloo) against TP=1 (one process, two threads): the same cores, split two ways.

    python -m bench.tp [--quick] [--model DIR] [--cache-dir DIR]

Workload: the `small` demo llama (hidden 512, 8 layers, 8 heads / 4 KV heads, vocab 32000) in
fp32 unless --model names another; greedy, ignore_eos, prompts of 16 random tokens. Two shapes,
each run on both sides in this one process (the order alternates, so neither side always runs
on a warmer machine): batch 1 (one stream of 64 new tokens; --quick 32) and 32 streams of 32
(--quick: 8 streams of 16) submitted at once. Printed per shape and side: decode tokens/s, and
for TP=2 rank 0's time per step in the step broadcast and in the all_reduces (two per layer;
rank 0's wait includes the slower rank's compute, so it is an upper bound on the wire time).
Then TP=2 / TP=1 throughput ratios. The last line is one JSON object.
On a 2-core machine TP=2 is expected to lose: the all_reduce and the broadcast are pure cost
there and one process with two threads already uses both cores; the point of TP is a model
that does not fit one device (docs/deployment.md).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from bench.http import DEFAULT_CACHE
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.models.parallel import comm


def model_dir(cache_dir: Path) -> Path:
    from runtime.models.demo import make_demo_model

    path = cache_dir / "tp-llama-small"
    if not (path / "config.json").is_file():
        make_demo_model(path, arch="llama", size="small", progress=True)
    return path


def run(path: Path, tp: int, streams: int, new_tokens: int) -> dict[str, Any]:
    config = EngineConfig(
        model_path=path,
        model_name="tp",
        device="cpu",
        compile="off",
        batch_warmup=False,
        num_threads=1 if tp > 1 else 2,
        max_num_seqs=max(streams, 1),
        min_num_seqs=max(streams, 1),
        initial_num_seqs=max(streams, 1),
        kv_cache_bytes=256 << 20,
        tensor_parallel_size=tp,
    )
    engine = Engine(config)
    engine.load()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 32000, (16,), generator=g).tolist() for _ in range(streams)]

    def submit_all(tokens: int) -> int:
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        handles = [
            engine.submit(GenerationRequest(f"b{i}-{time.monotonic_ns()}", p, params))
            for i, p in enumerate(prompts)
        ]
        return sum(len(h.result(timeout=1800).token_ids) for h in handles)

    try:
        submit_all(2)  # warm: first-step allocations, the workers' first forward
        broadcast = _time_broadcasts(engine) if tp > 1 else None
        comm.STATS.timed, comm.STATS.num_calls, comm.STATS.seconds = tp > 1, 0, 0.0
        started = time.perf_counter()
        tokens = submit_all(new_tokens)
        wall_s = time.perf_counter() - started
        comm.STATS.timed = False
    finally:
        engine.shutdown()
    layers = 8
    steps = comm.STATS.num_calls / (2 * layers) if tp > 1 else 0
    out: dict[str, Any] = {"tp": tp, "streams": streams, "tokens_per_s": tokens / wall_s}
    if tp > 1 and steps:
        assert broadcast is not None
        out["steps"] = int(steps)
        out["all_reduce_ms_per_step"] = 1e3 * comm.STATS.seconds / steps
        out["broadcast_ms_per_step"] = 1e3 * broadcast["s"] / max(broadcast["n"], 1)
        out["step_ms"] = 1e3 * wall_s / steps
    return out


def _time_broadcasts(engine: Engine) -> dict[str, float]:
    world = engine._parts.loaded.parallel
    send = world.send_step
    totals = {"s": 0.0, "n": 0.0}

    def timed(message: Any) -> None:
        started = time.perf_counter()
        send(message)
        totals["s"] += time.perf_counter() - started
        totals["n"] += 1

    world.send_step = timed
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, 8 streams")
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args()
    path = args.model or model_dir(args.cache_dir)
    shapes = [(1, 32), (8, 16)] if args.quick else [(1, 64), (32, 32)]
    results: dict[str, Any] = {}
    for i, (streams, tokens) in enumerate(shapes):
        order = (1, 2) if i % 2 == 0 else (2, 1)
        side = {tp: run(path, tp, streams, tokens) for tp in order}
        for tp in (1, 2):
            print(json.dumps(side[tp]))
        ratio = side[2]["tokens_per_s"] / side[1]["tokens_per_s"]
        print(f"streams={streams}: TP=2 x 1 thread / TP=1 x 2 threads throughput = {ratio:.2f}")
        results[f"streams_{streams}"] = {"tp1": side[1], "tp2": side[2], "ratio": ratio}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
