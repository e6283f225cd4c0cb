"""The `--out` / `--check` half shared by `fastllm alerts export` and `fastllm dashboards
export`: write a generated file (or print it), or check that a checked-in copy is current."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click


def out_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--out FILE` (default: stdout) and `--check` (exit 1 when FILE differs)."""
    command = click.option(
        "--check", is_flag=True, help="exit 1 when --out differs from a fresh export"
    )(command)
    return click.option(
        "--out",
        "out_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="file to write (default: stdout)",
    )(command)


def write_or_check(
    ctx: click.Context,
    out_path: Path | None,
    check: bool,
    render: Callable[[], str],
    problems: Callable[[Path], list[str]],
) -> None:
    if check:
        if out_path is None:
            raise click.UsageError("--check needs --out")
        found = problems(out_path)
        for problem in found:
            click.echo(problem, err=True)
        if found:
            ctx.exit(1)
        click.echo(f"{out_path} is up to date")
        return
    text = render()
    if out_path is None:
        click.echo(text, nl=False)
    else:
        out_path.write_text(text, encoding="utf-8")
        click.echo(f"wrote {out_path}")
