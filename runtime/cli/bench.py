"""`fastllm bench NAME [--quick]`: run one of the repository's benchmarks (bench/NAME.py).

Benchmarks live in the repository (not the installed package) because they compare against
reference implementations (transformers, torch.empty, ...) in the same run: run it from a
checkout.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from runtime.errors import ConfigError

BENCHMARKS = (
    "generate",
    "allocator",
    "soak",
    "serving",
    "http",
    "telemetry",
    "storage",
    "batching",
    "logprobs",
)


@click.command(name="bench", context_settings={"ignore_unknown_options": True})
@click.argument("name", type=click.Choice(BENCHMARKS))
@click.option("--quick", is_flag=True, help="the short version (about a minute)")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def command(name: str, quick: bool, extra: tuple[str, ...]) -> None:
    """Run benchmark NAME; its last output line is one JSON object of ratios.

    \b
    Example:
      fastllm bench allocator --quick
      fastllm bench soak --requests 100000
    """
    if not (Path.cwd() / "bench" / f"{name}.py").is_file():
        raise ConfigError(f"bench/{name}.py not found: run `fastllm bench` from a checkout")
    args = [sys.executable, "-m", f"bench.{name}", *(["--quick"] if quick else []), *extra]
    sys.exit(subprocess.call(args))
