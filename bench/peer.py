"""Batch-1 decode of this runtime vs llama.cpp on the same weights, same threads.

    python -m bench.peer [--quick] [--threads 1,2] [--clock wall|cpu] [--cache-dir DIR]

The `small` llama's random weights (built once under --cache-dir) are converted to an f32 GGUF
(`bench.gguf_export`: q/k rows permuted into llama.cpp's rope layout) and run by llama-cpp-python
(an optional extra, built from source: `CMAKE_ARGS="-DGGML_NATIVE=ON" pip install
llama-cpp-python gguf`; without it the bench says so and skips). Both sides decode greedily from
the same 32 prompt ids; the first 16 tokens of both must agree and the logits after the prompt
stay within 1e-3 of ours (a random model's greedy tokens can repeat; the logits cannot hide a
wrong conversion), or the comparison is void and the bench fails. Ours goes through the real
engine (offline `generate`), once on the fast decode step and once on the eager forward
(compile=off); llama.cpp through `Llama.eval` plus an argmax over its logits. Decode time =
time(prefill + N) - time(prefill + 1), best of interleaved rounds.

Each side runs in its own worker process, so the idle side's OpenMP threads never spin against
the one being timed; the workers take turns, one command at a time. On a shared, loaded machine
absolute tok/s mean little: read the ratios, measured in the same run. A fourth worker times only
the step's weight GEMMs (torch.matmul on the same weights, batch 1): its rate is the ceiling of
any step built on torch's GEMMs here, so `gemm_ceiling_ratio_vs_llama_cpp` < 1 says the target
is out of reach of overhead work alone.
Last line, one JSON object: {"threads_1": {"tokens_per_s", "eager_tokens_per_s",
"llama_cpp_tokens_per_s", "ratio_vs_llama_cpp", "eager_ratio_vs_llama_cpp",
"gemm_ceiling_tokens_per_s", "gemm_ceiling_ratio_vs_llama_cpp"}, ...,
"ratio_vs_llama_cpp": {"1": .., "2": ..}, "first_tokens_agree": true, "clock": "wall"}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.generate import DEFAULT_CACHE
from bench.peer_workers import Worker, llama_cpp_missing

AGREE_TOKENS = 16
LOGIT_TOL = 1e-3  # fp32 on both sides: only summation order differs


def _measure(workers: dict[str, Worker], threads: int, new_tokens: int, rounds: int) -> dict:
    best = {name: float("inf") for name in workers}
    for worker in workers.values():  # warm-up: first calls allocate, pick kernels
        worker.decode_seconds(threads, 2)
    for _ in range(rounds):  # interleaved: drift hits every side alike
        for name, worker in workers.items():
            best[name] = min(best[name], worker.decode_seconds(threads, new_tokens))
    rate = {name: new_tokens / max(s, 1e-9) for name, s in best.items()}
    return {
        "tokens_per_s": round(rate["fast"], 1),
        "eager_tokens_per_s": round(rate["eager"], 1),
        "llama_cpp_tokens_per_s": round(rate["llama_cpp"], 1),
        "ratio_vs_llama_cpp": round(rate["fast"] / rate["llama_cpp"], 3),
        "eager_ratio_vs_llama_cpp": round(rate["eager"] / rate["llama_cpp"], 3),
        # the weight GEMMs alone, measured in the same rounds: what the ratio could reach if
        # everything else of the step cost nothing
        "gemm_ceiling_tokens_per_s": round(rate["gemms"], 1),
        "gemm_ceiling_ratio_vs_llama_cpp": round(rate["gemms"] / rate["llama_cpp"], 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and rounds")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    missing = llama_cpp_missing()
    if missing:
        print(f"skipped: {missing}", file=sys.stderr)
        print(json.dumps({"skipped": missing}))
        return 0
    thread_counts = [int(t) for t in args.threads.split(",")]
    new_tokens, rounds = (16, 3) if args.quick else (64, 5)
    workers = Worker.start_all(args.cache_dir, args.clock)
    try:
        ours = workers["fast"].greedy_tokens(AGREE_TOKENS)
        eager = workers["eager"].greedy_tokens(AGREE_TOKENS)
        theirs = workers["llama_cpp"].greedy_tokens(AGREE_TOKENS)
        ours_logits = workers["eager"].prompt_logits()
        their_logits = workers["llama_cpp"].prompt_logits()
        logit_diff = max(abs(a - b) for a, b in zip(ours_logits, their_logits, strict=True))
        agree = ours == theirs == eager and logit_diff <= LOGIT_TOL
        print(f"first {AGREE_TOKENS} greedy tokens: ours {ours}", file=sys.stderr)
        print(f"                     llama.cpp {theirs}", file=sys.stderr)
        print(f"logits after the prompt: max |ours - llama.cpp| {logit_diff:.2e}", file=sys.stderr)
        if not agree:
            print("the sides disagree: the comparison is void", file=sys.stderr)
            void = {"first_tokens_agree": False, "ours": ours, "llama_cpp": theirs}
            print(json.dumps({**void, "first_logits_max_abs_diff": logit_diff}))
            return 1
        report: dict = {}
        for threads in thread_counts:
            report[f"threads_{threads}"] = _measure(workers, threads, new_tokens, rounds)
            print(f"threads {threads}: {report[f'threads_{threads}']}", file=sys.stderr)
    finally:
        for worker in workers.values():
            worker.close()
    report["ratio_vs_llama_cpp"] = {
        str(t): report[f"threads_{t}"]["ratio_vs_llama_cpp"] for t in thread_counts
    }
    report["first_tokens_agree"] = True
    report["first_logits_max_abs_diff"] = float(f"{logit_diff:.3g}")
    report["clock"] = args.clock
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
