"""The sampling stage of an engine step, before and after the sampling batch (issue 36), in one
run: from the step's logits to its tokens (and logprobs, when asked), with every per-row check
the step makes on the way.

    python -m bench.sampling_step [--quick] [--vocab N] [--rounds N]

Two batches of 32 decoding sequences over a vocabulary of `--vocab` tokens (the `small` llama's
32000 by default; a synthetic vocabulary, so no model is needed):
  plain   every row greedy, no feature (what a plain chat request is);
  mixed   a quarter of the rows with logprobs (top 5), a quarter with presence / frequency /
          repetition penalties, a quarter constrained by a JSON schema (XGrammar), a quarter plain;
          every row sampled at temperature 0.8, the logprob rows seeded.
`before` is the old path, kept as the reference in bench/sampling_step_old.py (a copy of the old
runner's sampling lines, `sample`, `process_logits`, the logprobs and grammar-mask calls, as they
were on main before issue 36); `after` is `SamplingBatch.build` + `Sampler` + `StepOutput.of`, as
the runner calls them. Both see fresh copies of the same logits each call; rounds alternate and the
best of each is kept (a shared, noisy machine). ratio = before / after (> 1: the new path is
faster). Both paths are run once from the same seeds first: the tokens and logprobs must be equal.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch
import xgrammar as xgr

from bench.sampling_step_old import Row, RowRequest, RowStops, old_step
from runtime.engine.constraints import ConstraintSpec, ConstraintState, GrammarCache
from runtime.engine.features import features_for
from runtime.engine.model_runner import StepOutput
from runtime.engine.sampling import SamplingParams
from runtime.engine.sampling.batch import SamplingBatch
from runtime.engine.sampling.draw import make_generator
from runtime.engine.sampling.sampler import Sampler

NUM_SEQS = 32
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}


# --- the new path -----------------------------------------------------------------------------
SAMPLER = Sampler()


def new_step(logits: torch.Tensor, seqs: list[Row]) -> StepOutput:
    """What the runner does from its logits on (the scheduler's counts included)."""
    featured = sum(1 for s in seqs if s.features is not None)
    random = sum(1 for s in seqs if not s.request.sampling.is_greedy)
    batch = SamplingBatch.build(
        seqs, featured=featured > 0, all_greedy=random == 0, device=logits.device
    )
    step = StepOutput.of(len(seqs), list(range(len(seqs))), batch, SAMPLER(logits, batch))
    for seq, entry in zip(seqs, step.logprobs or [None] * len(seqs), strict=True):
        f = seq.features  # the new core: the logprobs state, only for rows that have one
        if f is not None and f.logprobs is not None and entry is not None:
            f.logprobs.cumulative += entry.logprob
    return step


# --- the batches ------------------------------------------------------------------------------
def synthetic_vocab(size: int) -> list[str]:
    """Printable ASCII, then two- and three-letter pieces: JSON can be spelled in it."""
    chars = [chr(c) for c in range(32, 127)]
    out = list(chars)
    letters = "abcdefghijklmnopqrstuvwxyz"
    for a in letters + '"{}:, ':
        for b in letters + '"{}:, 0123456789':
            out.append(a + b)
    k = 0
    while len(out) < size:
        out.append(letters[k % 26] + letters[(k // 26) % 26] + letters[(k // 676) % 26] + str(k))
        k += 1
    return out[:size]


def params_for(kind: str, i: int) -> SamplingParams:
    if kind == "plain":
        return SamplingParams(max_tokens=64, temperature=0.0)
    quarter = i * 4 // NUM_SEQS
    if quarter == 0:
        return SamplingParams(max_tokens=64, temperature=0.8, logprobs=5, seed=i)
    if quarter == 1:
        return SamplingParams(
            max_tokens=64,
            temperature=0.8,
            presence_penalty=0.5,
            frequency_penalty=0.3,
            repetition_penalty=1.1,
        )
    return SamplingParams(max_tokens=64, temperature=0.8)


def make_rows(
    kind: str, vocab: int, grammars: GrammarCache, *, new: bool, seed: int = 0
) -> list[Row]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(NUM_SEQS):
        params = params_for(kind, i)
        constrained = kind == "mixed" and i * 4 // NUM_SEQS == 2
        state = None
        if constrained:  # its own matcher, on the grammar compiled once
            spec = ConstraintSpec.json_schema(SCHEMA, "response_format")
            future, hit = grammars.get(spec)
            future.result(timeout=60)
            state = ConstraintState(spec, future, hit)
            state.bind()
        prompt = torch.randint(3, vocab, (24,), generator=g).tolist()
        output = [] if constrained else torch.randint(3, vocab, (12,), generator=g).tolist()
        row = Row(RowRequest(params), prompt, output, RowStops(frozenset({0})))
        if new:
            row.features = features_for(params, 0, "cpu", constraint=state, verified=False)
        else:
            row.generator = make_generator(params.seed, "cpu")
            row.constraint = state
        rows.append(row)
    return rows


# --- the run ----------------------------------------------------------------------------------
def check_same(kind: str, vocab: int, grammars: GrammarCache) -> bool:
    """Same seeds, same logits: the old and the new path give the same tokens and logprobs."""
    logits = torch.randn(NUM_SEQS, vocab, generator=torch.Generator().manual_seed(7)) * 4
    old_rows = make_rows(kind, vocab, grammars, new=False)
    new_rows = make_rows(kind, vocab, grammars, new=True)
    torch.manual_seed(1)
    old_tokens = old_step(logits.clone(), old_rows)
    old_sums = [r.cumulative_logprob for r in old_rows]
    torch.manual_seed(1)
    new = new_step(logits.clone(), new_rows)
    new_sums = [
        r.features.logprobs.cumulative
        if r.features is not None and r.features.logprobs is not None
        else 0.0
        for r in new_rows
    ]
    return old_tokens == new.token_ids and old_sums == new_sums


def best_of(
    step: Callable[[torch.Tensor, list[Row]], Any],
    logits: torch.Tensor,
    rows: list[Row],
    calls: int,
) -> float:
    """Seconds per call, over `calls` calls on fresh copies of the logits (copies timed apart)."""
    copies = [logits.clone() for _ in range(calls)]
    t0 = time.perf_counter()
    for copy in copies:
        step(copy, rows)
    return (time.perf_counter() - t0) / calls


def measure(
    kind: str, vocab: int, grammars: GrammarCache, rounds: int, calls: int
) -> dict[str, float]:
    logits = torch.randn(NUM_SEQS, vocab, generator=torch.Generator().manual_seed(3)) * 4
    old_rows = make_rows(kind, vocab, grammars, new=False)
    new_rows = make_rows(kind, vocab, grammars, new=True)
    before = after = float("inf")
    for _ in range(rounds):  # alternated, best of each kept
        before = min(before, best_of(old_step, logits, old_rows, calls))
        after = min(after, best_of(new_step, logits, new_rows, calls))
    return {"before_us": before * 1e6, "after_us": after * 1e6, "ratio": before / after}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and calls")
    parser.add_argument("--vocab", type=int, default=32000, help="the reported ratios' vocab")
    parser.add_argument(
        "--host-vocab", type=int, default=512, help="a small vocab: the per-row host work shows"
    )
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds = args.rounds or (5 if args.quick else 15)
    calls = 20 if args.quick else 50
    report: dict[str, Any] = {"num_seqs": NUM_SEQS, "rounds": rounds}
    for vocab in (args.vocab, args.host_vocab):
        info = xgr.TokenizerInfo(synthetic_vocab(vocab), stop_token_ids=[0])
        grammars = GrammarCache(info)
        try:
            for kind in ("plain", "mixed"):
                same = check_same(kind, vocab, grammars)
                result = measure(kind, vocab, grammars, rounds, calls)
                rounded = {k: round(v, 3) for k, v in result.items()}
                report[f"{kind}_v{vocab}"] = {**rounded, "same_output": same}
                print(
                    f"{kind:6s} vocab {vocab:6d}  before {result['before_us']:9.1f} us"
                    f"  after {result['after_us']:9.1f} us  ratio {result['ratio']:.2f}x"
                    f"  same output: {same}",
                    flush=True,
                )
        finally:
            grammars.close()
    report["plain_ratio"] = report[f"plain_v{args.vocab}"]["ratio"]
    report["mixed_ratio"] = report[f"mixed_v{args.vocab}"]["ratio"]
    report["target"] = 1.0
    print(json.dumps(report))


if __name__ == "__main__":
    main()
