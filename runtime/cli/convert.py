"""`fastllm convert`: an old checkpoint (safetensors or a legacy pytorch_model.bin, read with
weights_only=True) -> a safetensors checkpoint, optionally with the GeGLU fix applied."""

from __future__ import annotations

from pathlib import Path

import click

EPILOG = """\b
Examples:
  fastllm convert --input old-models/gemma --output models/gemma --fix-geglu
  fastllm convert --input old-models/llama --output models/llama
  fastllm convert --input models/gemma --output models/gemma-2 --fix-geglu --force
"""


@click.command("convert", epilog=EPILOG)
@click.option(
    "--input",
    "input_dir",
    required=True,
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    help="Checkpoint directory to read (config.json + safetensors or pytorch_model.bin).",
)
@click.option(
    "--output",
    "output_dir",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Directory to write (created): model.safetensors + the copied config/tokenizer.",
)
@click.option(
    "--fix-geglu",
    is_flag=True,
    help="Normalise each row of the GeGLU projections (mlp gate_proj/up_proj): "
    "(w - mean) / (std + 1e-6).",
)
@click.option("--force", is_flag=True, help="Apply --fix-geglu even if the input already has it.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def command(input_dir: Path, output_dir: Path, fix_geglu: bool, force: bool, quiet: bool) -> None:
    """Convert the checkpoint in --input to safetensors in --output, recording provenance
    (fastllm.geglu_fix, fastllm.source_sha256, fastllm.converted_from) in its metadata."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from runtime.tools.convert import convert_checkpoint

    console = Console(stderr=True)
    columns = (
        TextColumn("converting"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[name]}"),
    )
    # transient: a failure leaves only its one error line; success prints its own line below
    with Progress(*columns, console=console, disable=quiet, transient=True) as progress:
        task = progress.add_task("convert", total=None, name="")

        def on_tensor(name: str, index: int, total: int) -> None:
            progress.update(task, completed=index, total=total, name=name)

        result = convert_checkpoint(
            input_dir, output_dir, fix_geglu=fix_geglu, force=force, on_tensor=on_tensor
        )
    fixed = f", GeGLU fix on {len(result.fixed_tensors)} tensors" if result.fixed_tensors else ""
    click.echo(
        f"wrote {result.output / 'model.safetensors'}: {result.num_tensors} tensors from "
        f"{result.converted_from}{fixed} (source sha256 {result.source_sha256[:12]}…)"
    )
