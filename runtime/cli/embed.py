"""`fastllm embed`: sentence embeddings from an encoder (BERT) checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import click

EPILOG = """\b
Examples:
  fastllm embed --model demo-models/bert-tiny "first text" "second text"
  fastllm embed --model demo-models/bert-tiny --json "one text" | jq '.data[0].embedding | length'
"""


@click.command("embed", epilog=EPILOG)
@click.option(
    "--model",
    "model_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="HuggingFace-layout encoder model directory.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='One JSON document {"model", "data": [{"index", "embedding"}]} instead of '
    "one JSON array per line.",
)
@click.option("--dtype", default="float32", show_default=True, help="float32|bfloat16|float16")
@click.option("--device", default="auto", show_default=True, help="auto|cpu|cuda[:N]")
@click.argument("texts", nargs=-1, required=True)
def command(
    model_dir: Path, as_json: bool, dtype: str, device: str, texts: tuple[str, ...]
) -> None:
    """Print one L2-normalised, mean-pooled embedding per TEXT (a JSON array per line)."""
    from runtime.engine.config import EngineConfig
    from runtime.engine.engine import Engine

    # the server's embedding path, with no sink (one embedding path in the project)
    engine = Engine(EngineConfig(model_path=model_dir, dtype=dtype, device=device))
    try:
        vectors = engine.embed(list(texts)).embeddings
    finally:
        engine.shutdown()
    if as_json:
        data = [{"index": i, "embedding": v} for i, v in enumerate(vectors)]
        click.echo(json.dumps({"model": str(model_dir), "data": data}))
        return
    for vector in vectors:
        click.echo(json.dumps(vector))
