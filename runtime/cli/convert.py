"""`fastllm convert`: an old checkpoint (safetensors or a legacy pytorch_model.bin, read with
weights_only=True) -> a safetensors checkpoint, optionally with the GeGLU fix applied; or a GGUF
file (llama.cpp's format) -> an HF-layout directory (dequantized float32 weights + tokenizer)."""

from __future__ import annotations

from pathlib import Path

import click

EPILOG = """\b
Examples:
  fastllm convert --input old-models/gemma --output models/gemma --fix-geglu
  fastllm convert --input old-models/llama --output models/llama
  fastllm convert --input models/gemma --output models/gemma-2 --fix-geglu --force
  fastllm convert --input models/llama --output models/llama-int4 --quantize int4
  fastllm convert --input SmolLM2-135M-Instruct.Q4_1.gguf --output models/smollm2
"""


@click.command("convert", epilog=EPILOG)
@click.option(
    "--input",
    "input_dir",
    required=True,
    type=click.Path(path_type=Path, exists=True),
    help="Checkpoint directory to read (config.json + safetensors or pytorch_model.bin), "
    "or a .gguf file.",
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
@click.option(
    "--quantize",
    type=click.Choice(["int8", "int4"]),
    default=None,
    help="Store the decoder's linear weights quantized (int8 per channel; int4 group-wise, "
    "asymmetric). `fastllm serve` loads the result as it is.",
)
@click.option(
    "--group-size",
    type=click.Choice(["32", "64", "128", "256"]),
    default="32",
    show_default=True,
    help="int4: input features per scale and zero.",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def command(
    input_dir: Path,
    output_dir: Path,
    fix_geglu: bool,
    force: bool,
    quantize: str | None,
    group_size: str,
    quiet: bool,
) -> None:
    """Convert the checkpoint in --input to safetensors in --output, recording provenance
    (fastllm.geglu_fix, fastllm.source_sha256, fastllm.converted_from; for a GGUF input also
    fastllm.gguf_file and fastllm.gguf_types, its quantization) in its metadata."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from runtime.errors import ConfigError
    from runtime.models.gguf_io.reader import is_gguf
    from runtime.tools.convert import convert_checkpoint
    from runtime.tools.convert_gguf import convert_gguf

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

        if is_gguf(input_dir):  # a llama.cpp file: dequantized into an HF-layout directory
            if fix_geglu or quantize:
                flag = "fix_geglu" if fix_geglu else "quantize"
                raise ConfigError(
                    f"--{flag.replace('_', '-')} does not apply to a GGUF input (convert it "
                    "first, then convert the directory)",
                    param=flag,
                )
            result = convert_gguf(input_dir, output_dir, on_tensor=on_tensor)
        else:
            result = convert_checkpoint(
                input_dir,
                output_dir,
                fix_geglu=fix_geglu,
                force=force,
                on_tensor=on_tensor,
                quantize=quantize,
                group_size=int(group_size),
            )
    fixed = f", GeGLU fix on {len(result.fixed_tensors)} tensors" if result.fixed_tensors else ""
    if result.quantization:
        worst = max(result.quantization, key=lambda r: r.rel_rms_error)
        packed = sum(r.weight_bytes for r in result.quantization)
        dense = sum(r.float_bytes for r in result.quantization)
        fixed += (
            f", {len(result.quantization)} projections {quantize} ({dense / 2**20:.1f} MiB -> "
            f"{packed / 2**20:.1f} MiB; worst relative RMS error {worst.rel_rms_error:.4f} in "
            f"{worst.name})"
        )
    click.echo(
        f"wrote {result.output / 'model.safetensors'}: {result.num_tensors} tensors from "
        f"{result.converted_from}{fixed} (source sha256 {result.source_sha256[:12]}…)"
    )
