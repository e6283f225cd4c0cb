"""`fastllm doctor`: run the troubleshooting checklist and print a pass/fail table with fixes."""

from __future__ import annotations

from pathlib import Path

import click

from runtime.cli.params import Bounded

EPILOG = """\b
Examples:
  fastllm doctor --model demo-models/llama-tiny
  fastllm doctor --model models/gemma --database-url postgresql+psycopg://fastllm@db/fastllm
  fastllm doctor --metrics-url http://127.0.0.1:8000/metrics --no-model
  fastllm doctor --model demo-models/llama-tiny --tensor-parallel-size 2
"""

_STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow"}


@click.command("doctor", epilog=EPILOG)
@click.option(
    "--model",
    "model_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Model directory to check (default: settings.model_path).",
)
@click.option("--no-model", is_flag=True, help="Skip the model checks.")
@click.option("--device", default=None, help="auto|cpu|cuda[:N] (default: settings.device)")
@click.option("--legacy-support", is_flag=True, default=None, help="Allow pytorch_model.bin.")
@click.option("--database-url", default=None, help="default: settings.database_url")
@click.option("--no-db", is_flag=True, help="Skip the database check.")
@click.option("--metrics-url", default=None, help="Scrape this /metrics URL and parse it.")
@click.option(
    "--tensor-parallel-size",
    type=Bounded(1, 64),
    default=None,
    help="Check the model split over N ranks, as serve runs it (default: settings).",
)
@click.pass_context
def command(
    ctx: click.Context,
    model_path: Path | None,
    no_model: bool,
    device: str | None,
    legacy_support: bool | None,
    database_url: str | None,
    no_db: bool,
    metrics_url: str | None,
    tensor_parallel_size: int | None,
) -> None:
    """Check torch/CUDA, every fast op against its reference, the model (load, GeGLU
    provenance, tokenizer, generation; every quantized linear against its dequantized
    reference when FASTLLM_QUANTIZATION is set or the checkpoint is quantized), the database
    and optionally a /metrics scrape. Exits 1 when any check fails."""
    from rich.console import Console
    from rich.table import Table

    from runtime.config import load_settings
    from runtime.tools.doctor import FAIL, DoctorOptions, run_checks

    settings = load_settings(device=device, legacy_support=legacy_support)
    options = DoctorOptions(
        model_path=None if no_model else (model_path or Path(settings.model_path)),
        device=settings.device,
        dtype=settings.dtype,
        legacy_support=settings.legacy_support,
        quantization=settings.quantization,
        database_url=None if no_db else (database_url or settings.database_url),
        metrics_url=metrics_url,
        compile=settings.compile,
        compile_cache_dir=settings.compile_cache_dir,
        tensor_parallel_size=tensor_parallel_size or settings.tensor_parallel_size,
    )
    results = run_checks(options)
    table = Table(title="fastllm doctor", show_lines=False)
    for column in ("check", "result", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for r in results:
        table.add_row(r.name, f"[{_STYLE[r.status]}]{r.status.upper()}[/]", r.detail, r.fix)
    Console(width=160).print(table)
    failed = [r for r in results if r.status == FAIL]
    if failed:
        # one unwrapped line per failure as well (logs, grep), after the table
        for r in failed:
            click.echo(f"FAIL {r.name}: {r.detail}\n  fix: {r.fix}", err=True)
        click.echo(f"{len(failed)} check(s) failed", err=True)
        ctx.exit(1)
    click.echo("all checks passed")
