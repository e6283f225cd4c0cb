"""Structured output's cost: decode tokens/s of a batch with half of its rows constrained against
the same batch unconstrained, in one run, and grammar compile times for the test set's schemas.

    python -m bench.structured [--quick] [--device auto|cpu|cuda] [--cache-dir DIR]
                               [--batch N] [--threads N] [--clock wall|cpu]

Both runs go through the same Engine on the `small` demo llama (vocab 32000, so each mask covers
32000 tokens), greedy, prompts of one length. The constrained half follows an EBNF grammar of
exactly 3000 characters of [a-z ] (it cannot complete within the run, so every row decodes every
step in both runs: the batch stays the same and only the masking differs). Unconstrained rows
run with ignore_eos. Rounds are interleaved and the best of each side is kept (noisy machines);
`--clock cpu` counts the process's CPU time instead of wall time (steadier on a shared CPU, with
--threads 1: it measures the work, masking included, not the wait for a core).
Compile times are fresh compiles (no cache) of the schemas the tests use, on the same vocabulary.
The last line is one JSON object:
{"tokens_per_s", "constrained_tokens_per_s", "ratio", "target", "compile_ms": {...}}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import xgrammar as xgr

from runtime.engine.constraints import ConstraintSpec
from runtime.engine.constraints.vocab import tokenizer_info
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.models.demo import make_demo_model
from runtime.models.loader import load_model

TARGET_RATIO = 0.9
PROMPT_TOKENS = 32
DEFAULT_CACHE = Path(os.environ.get("FASTLLM_BENCH_CACHE", "/tmp/fastllm-bench"))
LONG_TEXT = ConstraintSpec("grammar", "root ::= [a-z ]{3000}", "guided_grammar")
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["C", "F"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
ITEM = {  # what pydantic makes of tests/runtime/server/test_structured_outputs.py's Item
    "$defs": {
        "Color": {"enum": ["red", "green"], "type": "string"},
        "Size": {
            "type": "object",
            "properties": {
                "width": {"type": "integer", "minimum": 1, "maximum": 50},
                "height": {"type": "integer", "minimum": 1, "maximum": 50},
            },
            "required": ["width", "height"],
            "additionalProperties": False,
        },
    },
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "color": {"$ref": "#/$defs/Color"},
        "size": {"$ref": "#/$defs/Size"},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        "note": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]},
    },
    "required": ["name", "color", "size", "tags", "note"],
    "additionalProperties": False,
}
COMPILE_SET = {
    "json_object": ConstraintSpec("json_object", "", "response_format"),
    "schema_item_nested": ConstraintSpec.json_schema(ITEM, "response_format"),
    "schema_tool_weather": ConstraintSpec.json_schema(WEATHER, "tools"),
    "regex": ConstraintSpec("regex", r"[A-Z]{2}-\d{2,4}", "guided_regex"),
    "choice": ConstraintSpec.choice(["alpha", "beta", "gamma ray"], "guided_choice"),
    "grammar_long_text": LONG_TEXT,
}


def run_batch(
    engine: Engine,
    prompts: list[list[int]],
    n: int,
    constrained: bool,
    tag: str,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Tokens/s of one batch (`clock` time from submit to the last result)."""
    requests = []
    for i, prompt in enumerate(prompts):
        with_grammar = constrained and i % 2 == 0
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=not with_grammar)
        spec = LONG_TEXT if with_grammar else None
        requests.append(GenerationRequest(f"{tag}-{i}", prompt, params, constraint=spec))
    t0 = clock()
    handles = [engine.submit(r) for r in requests]
    outs = [h.result(timeout=600) for h in handles]
    elapsed = clock() - t0
    assert all(o.completion_tokens == n for o in outs), [o.completion_tokens for o in outs]
    return sum(o.completion_tokens for o in outs) / elapsed


def compile_ms(info: xgr.TokenizerInfo) -> dict[str, float]:
    compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
    out = {}
    for name, spec in COMPILE_SET.items():
        grammar = spec.to_grammar()
        t0 = time.perf_counter()
        compiler.compile_grammar(grammar)
        out[name] = round((time.perf_counter() - t0) * 1e3, 2)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and rounds")
    parser.add_argument("--device", default="cpu", help="auto | cpu | cuda")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--batch", type=int, default=8, help="rows per batch (half constrained)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall", help="cpu: process time"
    )
    args = parser.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    path = args.cache_dir / "llama-small-seed0"
    if not (path / "config.json").is_file():
        print(f"building the small llama under {path}", file=sys.stderr)
        make_demo_model(path, arch="llama", size="small", seed=0, progress=True)
    config = EngineConfig(
        model_name="small",
        device=args.device,
        compile="off",
        batch_warmup=False,
        max_num_seqs=args.batch,
        min_num_seqs=args.batch,
        initial_num_seqs=args.batch,
    )
    engine = Engine(config, loader=lambda: load_model(path, dtype="float32", device=args.device))
    engine.load()
    vocab = engine.loaded.args.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(4, min(vocab, 1000), (args.batch, PROMPT_TOKENS), generator=gen)
    n, rounds = (16, 2) if args.quick else (64, 3)
    run_batch(engine, prompts.tolist(), 4, True, "warm")  # compiles the grammar, warms both paths
    plain = constrained = 0.0
    for r in range(rounds):  # interleaved, so drift hits both alike
        plain = max(plain, run_batch(engine, prompts.tolist(), n, False, f"plain{r}", clock))
        half = run_batch(engine, prompts.tolist(), n, True, f"half{r}", clock)
        constrained = max(constrained, half)
    engine.shutdown()
    info = tokenizer_info(engine.tokenizer, vocab)
    report = {
        "batch": args.batch,
        "clock": args.clock,
        "new_tokens": n,
        "vocab_size": vocab,
        "tokenizer_vocab_size": engine.tokenizer.vocab_size,  # the rest is never allowed
        "tokens_per_s": round(plain, 1),
        "constrained_tokens_per_s": round(constrained, 1),
        "ratio": round(constrained / plain, 3),
        "target": TARGET_RATIO,
        "compile_ms": compile_ms(info),
    }
    if report["ratio"] < TARGET_RATIO:
        print(f"below the {TARGET_RATIO} target: {report['ratio']}", file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
