"""Logprobs and sampling controls: what they cost the requests that use none of them, and how
fast the engine scores prompts (loglikelihood) against `transformers` scoring the same prompts.

    python -m bench.logprobs [--quick] [--model DIR|FILE.gguf] [--device cpu|cuda] [--threads N]

Model: the `small` llama (random weights) under --cache-dir (the checkpoint bench.serving and
bench.http use), or --model; --quick uses the tiny demo llama and fewer requests.
1. plain_ratio: engine throughput (generated tokens / wall) of plain greedy requests as built,
   over the same workload with the per-step hooks of runtime.engine.logits / logprobs switched
   off (the pre-logprobs step: no checks at all), rounds alternated, best of each kept.
   >= 0.97 means the hooks cost plain requests nothing measurable.
2. score_ratio: prompt tokens/s of loglikelihood scoring through the engine (what
   `echo: true, logprobs: 1, max_tokens: 1` runs: prompt_logprobs=1 on every prompt position)
   over transformers scoring the same prompts (one forward per batch of 8 equal-length prompts,
   log_softmax, gather), same run. The two sums agree to max_abs_diff (printed);
   prefill_only_prompt_tokens_per_s is the engine on the same prompts without logprobs
   (a prompt-logprobs request skips the prefix cache, so this run has no cache hits either).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import runtime.engine.model_runner as model_runner
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.engine.sampling.batch import SamplingBatch
from runtime.engine.sequence import Sequence

DEFAULT_CACHE = Path(os.environ.get("FASTLLM_BENCH_CACHE", "/tmp/fastllm-bench"))
TARGETS = {"plain_ratio": 0.97}


@contextmanager
def hooks_off() -> Iterator[None]:
    """The step as it was before logprobs and controls: none of their per-row checks run."""
    saved = model_runner.SamplingBatch
    prop = Sequence.needs_prompt_logits

    class Bare(SamplingBatch):  # every step a greedy-only batch, whatever its rows ask
        @classmethod
        def build(cls, seqs: Any, **_: Any) -> SamplingBatch:  # type: ignore[override]
            return SamplingBatch(rows=list(seqs), num_own=len(seqs))

    model_runner.SamplingBatch = Bare  # type: ignore[misc]
    Sequence.needs_prompt_logits = property(lambda self: False)  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        model_runner.SamplingBatch = saved  # type: ignore[misc]
        Sequence.needs_prompt_logits = prop  # type: ignore[method-assign]


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=g).tolist()


def plain_round(engine: Engine, work: list[list[int]], new_tokens: int, tag: str) -> float:
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    handles = [
        engine.submit(GenerationRequest(f"{tag}-{i}", p, params)) for i, p in enumerate(work)
    ]
    total = sum(h.result(timeout=3600).completion_tokens for h in handles)
    return total / (time.perf_counter() - start)


def engine_scores(
    engine: Engine, work: list[list[int]], tag: str, *, logprobs: bool = True
) -> tuple[float, list[float]]:
    params = SamplingParams(max_tokens=1, temperature=0.0)
    if logprobs:
        params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=1, prompt_logprobs=1)
    start = time.perf_counter()
    handles = [
        engine.submit(GenerationRequest(f"{tag}-{i}", p, params)) for i, p in enumerate(work)
    ]
    outs = [h.result(timeout=3600) for h in handles]
    elapsed = time.perf_counter() - start
    sums = [sum(e.logprob for e in o.prompt_logprobs or () if e is not None) for o in outs]
    return sum(len(p) for p in work) / elapsed, sums


def hf_scores(model: Any, work: list[list[int]], batch: int) -> tuple[float, list[float]]:
    sums: list[float] = []
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(work), batch):
            ids = torch.tensor(work[i : i + batch])
            logprobs = torch.log_softmax(model(ids).logits.float(), dim=-1)
            picked = logprobs[:, :-1].gather(2, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            sums.extend(picked.sum(dim=1).tolist())
    return sum(len(p) for p in work) / (time.perf_counter() - start), sums


def ensure_model(path: str | None, cache_dir: Path, quick: bool) -> Path:
    from runtime.models.demo import make_demo_model

    if path:  # a checkpoint dir, or a GGUF file converted once into cache_dir
        from bench.model_arg import resolve_model

        resolved = resolve_model(Path(path), cache_dir)
        assert resolved is not None
        return resolved
    name = "llama-tiny-seed0" if quick else "llama-small-seed0"  # bench.serving's checkpoint
    default = cache_dir / name
    if not (default / "config.json").exists():
        print(f"building {name} under {default}", file=sys.stderr)
        make_demo_model(default, arch="llama", size="tiny" if quick else "small", seed=0)
    return default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model", default=None, help="checkpoint dir or .gguf file")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = ensure_model(args.model, args.cache_dir, args.quick)
    streams, new_tokens, length, scored = (8, 8, 64, 16) if args.quick else (16, 32, 256, 32)
    engine = Engine(EngineConfig(model_path=model_dir, model_name="bench", device=args.device))
    vocab = engine.loaded.args.vocab_size
    work = prompts(streams, 32, vocab, seed=1)
    plain_round(engine, work, new_tokens, "warm")  # load, warm-up, fast-path capture
    built: list[float] = []
    off: list[float] = []
    for r in range(args.rounds):
        built.append(plain_round(engine, work, new_tokens, f"built{r}"))
        with hooks_off():
            off.append(plain_round(engine, work, new_tokens, f"off{r}"))
    score_work = prompts(scored, length, vocab, seed=2)
    engine_scores(engine, score_work[:2], "warm-score")
    engine_tps, ours = engine_scores(engine, score_work, "score")
    fresh = prompts(scored, length, vocab, seed=3)  # not in the prefix cache either
    prefill_tps, _ = engine_scores(engine, fresh, "prefill", logprobs=False)
    engine.shutdown()
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf_scores(hf, score_work[:2], 2)  # warm-up
    hf_tps, theirs = hf_scores(hf, score_work, 8)
    result = {
        "plain_tokens_per_s": max(built),
        "plain_tokens_per_s_hooks_off": max(off),
        "plain_ratio": max(built) / max(off),
        "score_prompt_tokens_per_s": engine_tps,
        "hf_score_prompt_tokens_per_s": hf_tps,
        "score_ratio": engine_tps / hf_tps,
        "prefill_only_prompt_tokens_per_s": prefill_tps,
        "max_abs_diff": max(abs(a - b) for a, b in zip(ours, theirs, strict=True)),
        "targets": TARGETS,
    }
    print(
        f"plain requests: {max(built):.1f} tok/s as built, {max(off):.1f} with the hooks off "
        f"(ratio {result['plain_ratio']:.3f})"
    )
    print(
        f"loglikelihood scoring: engine {engine_tps:.0f} prompt tok/s, transformers "
        f"{hf_tps:.0f} (ratio {result['score_ratio']:.2f}); max |diff| of the sums "
        f"{result['max_abs_diff']:.2e}; the same prompts without logprobs: {prefill_tps:.0f}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
