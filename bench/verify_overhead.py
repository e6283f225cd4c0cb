"""Serving with sampled verification (runtime.verify.verifier) at 1% vs off, same engine, same run.

The serving bench's workload (bench.serving_parts.make_workload) on the `small` llama: all
requests submitted at once, greedy, never stopping early. Rounds alternate off / on (these
machines are noisy; the best round of each is kept). An "on" round is timed until its requests
are done AND the verifier has finished every job they caused (`verify_wall_overhead_pct`).

`verify_overhead_pct` is the same cost measured as work, not wall time: the verifier thread's CPU
time per verified request over the process CPU time per served request of the "off" rounds, times
the 1% rate. With ~1% of a few hundred requests verified, a wall-clock difference of a few
percent is mostly noise on a shared machine (two "off" rounds differ by more than that); the CPU
ratio is not. It counts the work only where torch runs ops on the calling thread: on CPU pass
--threads 1 (on CUDA the cost is device time and the wall figure is the one to read).
Used by `python -m bench.storage`; also runs alone: `python -m bench.verify_overhead [--quick]`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.serving_parts import Workload, make_workload
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.models.demo import make_demo_model
from runtime.verify.verifier import Verifier

DEFAULT_CACHE = Path(os.environ.get("FASTLLM_BENCH_CACHE", "/tmp/fastllm-bench"))
SAMPLE_RATE = 0.01


def _run(engine: Engine, work: Workload, tag: str) -> int:
    handles = [
        engine.submit(
            GenerationRequest(
                f"{tag}{i}", p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
            )
        )
        for i, (p, n) in enumerate(zip(work.prompts, work.new_tokens, strict=True))
    ]
    return sum(h.result(timeout=3600).completion_tokens for h in handles)


def measure(
    *, quick: bool, cache_dir: Path = DEFAULT_CACHE, device: str = "auto"
) -> dict[str, Any]:
    path = cache_dir / "llama-small-seed0"
    if not (path / "config.json").is_file():
        print(f"building the small llama under {path}", file=sys.stderr)
        make_demo_model(path, arch="llama", size="small", seed=0, progress=True)
    num_requests, rounds = (128, 2) if quick else (400, 3)
    work = make_workload(num_requests, quick=True)  # 16-64 prompt tokens, 8-16 new tokens
    config = EngineConfig(
        model_path=path, model_name="small", device=device, max_num_seqs=32,
        initial_num_seqs=32, min_num_seqs=32, max_num_batched_tokens=1024,
        max_queued_requests=num_requests,
    )  # fmt: skip
    verifier = Verifier(None, sample_rate=1.0, queue_size=1024)
    engine = Engine(config, verifier=verifier)
    engine.load()
    _run(engine, make_workload(4, quick=True, seed=9), "warm")  # kernels + the reference path
    verifier.flush()
    verifier.sample_rate = SAMPLE_RATE
    best_off = best_on = float("inf")
    num_verified, verify_cpu_s, serve_cpu_s = 0, 0.0, 0.0
    for r in range(rounds):
        engine.verifier = None
        start, cpu_start = time.perf_counter(), time.process_time()
        _run(engine, work, f"off{r}-")
        serve_cpu_s += time.process_time() - cpu_start
        best_off = min(best_off, time.perf_counter() - start)
        engine.verifier = verifier
        before, cpu_before = verifier.num_verified, verifier.cpu_seconds
        start = time.perf_counter()
        _run(engine, work, f"on{r}-")
        verifier.flush()
        best_on = min(best_on, time.perf_counter() - start)
        num_verified += verifier.num_verified - before
        verify_cpu_s += verifier.cpu_seconds - cpu_before
    engine.shutdown()
    verifier.close()
    wall_pct = (best_on / best_off - 1.0) * 100.0
    # CPU of one verified request over CPU of serving one request, times the nominal 1% (the
    # hash picks about, not exactly, 1% of a few hundred ids)
    cpu_per_verified = verify_cpu_s / max(num_verified, 1)
    cpu_per_served = serve_cpu_s / (rounds * num_requests)
    work_pct = SAMPLE_RATE * cpu_per_verified / cpu_per_served * 100.0
    print(
        f"verify: off {best_off:.2f}s  on ({SAMPLE_RATE:.0%}) {best_on:.2f}s  "
        f"wall {wall_pct:+.2f}%;  CPU per verified request {cpu_per_verified * 1e3:.0f} ms, per "
        f"served request {cpu_per_served * 1e3:.0f} ms -> work at 1%: {work_pct:.2f}%  "
        f"({num_verified} verified over {rounds} rounds of {num_requests}; "
        f"dropped {verifier.num_dropped})",
        file=sys.stderr,
    )
    return {
        "verify_overhead_pct": round(work_pct, 2),
        "verify_wall_overhead_pct": round(wall_pct, 2),
        "verify_off_s": round(best_off, 3),
        "verify_on_s": round(best_on, 3),
        "verify_num_verified": num_verified,
        "verify_requests_per_round": num_requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    print(json.dumps(measure(quick=args.quick, device=args.device)))


if __name__ == "__main__":
    main()
