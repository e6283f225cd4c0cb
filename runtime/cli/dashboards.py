"""`fastllm dashboards`: render the grafanalib sources to JSON, or check the checked-in JSON."""

from __future__ import annotations

from pathlib import Path

import click

from dashboards.build import GENERATED_DIR, SOURCE_DIR
from runtime.cli.export_out import out_options, write_or_check

_out_option = click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=GENERATED_DIR,
    show_default=True,
    help="directory of the generated JSON (compose mounts it into Grafana)",
)
_source_option = click.option(
    "--source",
    "source_dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=SOURCE_DIR,
    show_default=True,
    help="directory of the *.dashboard.py sources",
)


@click.group("dashboards")
def command() -> None:
    """Grafana dashboards as code (grafanalib).

    \b
    Example:
      fastllm dashboards build            # writes dashboards/generated/*.json
      fastllm dashboards check            # exit 1 when the checked-in JSON is stale
    """


@command.command("build")
@_out_option
@_source_option
def build_cmd(out_dir: Path, source_dir: Path) -> None:
    """Render every *.dashboard.py to OUT/<name>.json (stable output: sorted keys)."""
    from dashboards.build import build

    for path in build(out_dir, source_dir):
        click.echo(f"wrote {path}")


@command.command("check")
@_out_option
@_source_option
@click.pass_context
def check_cmd(ctx: click.Context, out_dir: Path, source_dir: Path) -> None:
    """Exit 1 (naming each file) when the JSON in OUT differs from a fresh render."""
    from dashboards.build import check

    problems = check(out_dir, source_dir)
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        ctx.exit(1)
    click.echo(f"dashboards in {out_dir} are up to date")


@command.command("queries")
@_out_option
def queries_cmd(out_dir: Path) -> None:
    """List every PromQL and SQL query of the generated dashboards with its panel."""
    from dashboards.queries import all_queries

    for query in all_queries(out_dir):
        text = " ".join(query.text.split())
        click.echo(f"[{query.kind}] {query.where}: {text}")


@command.command("export")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["configmap"]),
    required=True,
    help='configmap: one Kubernetes ConfigMap per dashboard, labelled grafana_dashboard: "1"',
)
@out_options
@click.option(
    "--json-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=GENERATED_DIR,
    show_default=True,
    help="directory of the generated JSON",
)
@click.pass_context
def export_cmd(
    ctx: click.Context, fmt: str, out_path: Path | None, check: bool, json_dir: Path
) -> None:
    """Export the generated JSON for Kubernetes (deploy/k8s/base/grafana-dashboards.yaml).

    \b
    Example:
      fastllm dashboards export --format configmap --out deploy/k8s/base/grafana-dashboards.yaml
    """
    from dashboards import configmaps
    from dashboards.build import DashboardBuildError

    def render() -> str:
        try:
            return configmaps.configmaps(json_dir)
        except DashboardBuildError as exc:
            raise click.ClickException(str(exc)) from exc

    write_or_check(ctx, out_path, check, render, lambda path: configmaps.check(path, json_dir))
