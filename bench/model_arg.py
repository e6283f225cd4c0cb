"""`--model` for the benches: a checkpoint directory as is, or a GGUF file converted once into
`--cache-dir` (so the run, and its transformers reference, read an ordinary HF directory).

    bench.serving --model demo-models/smollm2-135m-instruct
    bench.soak --model ~/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="checkpoint dir or .gguf file (converted once into --cache-dir); default: the "
        "bench's random demo model",
    )


def resolve_model(model: Path | None, cache_dir: Path) -> Path | None:
    """The directory to run (None: the caller builds its default demo model)."""
    if model is None:
        return None
    from runtime.models.gguf_io import is_gguf

    if not is_gguf(model):
        return model
    out = cache_dir / f"gguf-{model.stem}"
    if not (out / "config.json").is_file():
        from runtime.tools.convert_gguf import convert_gguf

        print(f"converting {model} into {out}", file=sys.stderr)
        convert_gguf(model, out)
    return out
