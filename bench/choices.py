"""`n` choices over one prompt: one prefill and forked page tables, against n separate requests.

    python -m bench.choices [--quick] [--device cpu|cuda] [--cache-dir DIR]

Workload: the tiny demo llama with a 4096-token context, one random prompt of 1,024 tokens
(--quick: 512), n = 8 choices of 16 new tokens (temperature 1, seeded, never stopping early).
Measured in the same process, same engine settings, prefix caching off on both sides:
- forked: one request with n = 8;
- separate: 8 requests of the same prompt, submitted at once (what a server without n sharing
  runs: each computes the prompt and holds its own copy of the prompt's KV).
Printed: wall time, prompt tokens the model computed (from the engine's step stats) and the peak
KV pages in use of each side, and their ratios (forked / separate). Targets: prefill tokens
ratio <= 1/n + 0.01 (one prefill), peak pages ratio < 0.5. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bench.http import DEFAULT_CACHE
from bench.kv import StepSink, tiny_long_context_model
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.models.loader import LoadedModel, load_model

N, NEW_TOKENS = 8, 16


def run(loaded: LoadedModel, device: str, prompt: list[int], *, forked: bool) -> dict[str, float]:
    sink = StepSink()
    config = EngineConfig(
        model_name="choices",
        device=device,
        max_num_seqs=2 * N,
        min_num_seqs=2 * N,
        initial_num_seqs=2 * N,
        max_num_batched_tokens=8192,
        enable_prefix_caching=False,  # the same on both sides: sharing comes from the fork only
        compile="off",
    )
    engine = Engine(config, sink, loader=lambda: loaded)
    engine.load()
    try:
        started = time.perf_counter()
        if forked:
            params = SamplingParams(max_tokens=NEW_TOKENS, n=N, seed=0, ignore_eos=True)
            handles = [engine.submit(GenerationRequest("f", prompt, params))]
        else:
            handles = [
                engine.submit(
                    GenerationRequest(
                        f"s{i}",
                        prompt,
                        SamplingParams(max_tokens=NEW_TOKENS, seed=i, ignore_eos=True),
                    )
                )
                for i in range(N)
            ]
        num_tokens = sum(len(out.token_ids) for handle in handles for out in handle)
        wall_s = time.perf_counter() - started
    finally:
        engine.shutdown()
    assert num_tokens == N * NEW_TOKENS, num_tokens
    return {
        "wall_s": wall_s,
        "prefill_tokens": sum(s.num_prefill_tokens for s in sink.steps),
        "peak_used_pages": max(s.kv.num_used_pages for s in sink.steps if s.kv is not None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 512-token prompt")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args()
    loaded = load_model(tiny_long_context_model(args.cache_dir), device=args.device)
    prompt_tokens = 512 if args.quick else 1024
    prompt = torch.randint(4, 500, (prompt_tokens,), generator=torch.Generator().manual_seed(0))
    ids = prompt.tolist()
    run(loaded, args.device, ids[:64], forked=True)  # warm-up
    forked = run(loaded, args.device, ids, forked=True)
    separate = run(loaded, args.device, ids, forked=False)
    ratios = {k: round(forked[k] / separate[k], 4) for k in forked}
    for name, side in (("forked (n=8)", forked), ("separate (8 requests)", separate)):
        print(
            f"{name}: {side['wall_s']:.2f} s, {side['prefill_tokens']:.0f} prompt tokens "
            f"computed, peak {side['peak_used_pages']:.0f} KV pages",
            flush=True,
        )
    targets = {"prefill_tokens_ratio": round(1 / N + 0.01, 4), "peak_used_pages_ratio": 0.5}
    summary = {
        "bench": "choices",
        "device": args.device,
        "n": N,
        "prompt_tokens": prompt_tokens,
        "forked": forked,
        "separate": separate,
        "wall_s_ratio": ratios["wall_s"],
        "prefill_tokens_ratio": ratios["prefill_tokens"],
        "peak_used_pages_ratio": ratios["peak_used_pages"],
        "targets": targets,
    }
    summary["meets_targets"] = (
        summary["prefill_tokens_ratio"] <= targets["prefill_tokens_ratio"]
        and summary["peak_used_pages_ratio"] < targets["peak_used_pages_ratio"]
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
