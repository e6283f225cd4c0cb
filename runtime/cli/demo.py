"""`fastllm make-demo-model`: a random-weight checkpoint in HuggingFace layout + a BPE tokenizer."""

from __future__ import annotations

from pathlib import Path

import click

from runtime.cli.params import Bounded
from runtime.models.demo import ARCHS, SIZES

EPILOG = """\b
Examples:
  fastllm make-demo-model demo-models/llama-tiny --arch llama
  fastllm make-demo-model /tmp/llama-small --arch llama --size small --seed 1
  fastllm make-demo-model demo-models/bert-tiny --arch bert
"""


@click.command("make-demo-model", epilog=EPILOG)
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--arch", type=click.Choice(ARCHS), default="llama", show_default=True)
@click.option(
    "--size",
    type=click.Choice(SIZES),
    default="tiny",
    show_default=True,
    help="tiny: hidden 64, 2 layers; small: the ~56M-parameter benchmark model.",
)
@click.option(
    "--seed",
    type=Bounded(0, 2**63 - 1),
    default=0,
    show_default=True,
    help="Same seed -> identical files.",
)
def command(directory: Path, arch: str, size: str, seed: int) -> None:
    """Write random weights (safetensors, config.json) and a tokenizer to DIRECTORY."""
    from runtime.models.demo import make_demo_model

    path = make_demo_model(directory, arch=arch, size=size, seed=seed, progress=True)
    click.echo(str(path), err=True)
