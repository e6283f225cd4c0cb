"""`fastllm alerts`: validate the rule file, or run the evaluator against any runtime."""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
from pathlib import Path

import click

from alerts.errors import AlertRuleError
from runtime.cli.export_out import out_options, write_or_check
from runtime.cli.params import Bounded, Finite


@click.group("alerts")
def command() -> None:
    """Alert rules: check them, or evaluate them against a running runtime.

    \b
    Examples:
      fastllm alerts check
      fastllm alerts run --metrics-url http://127.0.0.1:8000/metrics --webhook http://127.0.0.1:5001/
    """


@command.command("check")
@click.option(
    "--rules",
    "rules_path",
    type=click.Path(path_type=Path),
    default=None,
    help="rule file (default: the packaged alerts/rules/fastllm.rules.yml)",
)
@click.option(
    "--promtool/--no-promtool",
    default=True,
    help="also run `promtool check rules` when promtool is installed",
)
def check(rules_path: Path | None, promtool: bool) -> None:
    """Validate a rule file with the embedded evaluator's parser (and promtool if present).

    \b
    Example:
      fastllm alerts check --rules alerts/rules/fastllm.rules.yml
    """
    from alerts.rules import DEFAULT_RULES_PATH, load_rules

    path = rules_path or DEFAULT_RULES_PATH
    groups = load_rules(path)  # AlertRuleError -> "error: ..." and exit 2
    count = sum(len(g.rules) for g in groups)
    click.echo(f"{path}: {count} alerting rules parse and use only supported PromQL")
    binary = shutil.which("promtool")
    if promtool and binary:
        result = subprocess.run(
            [binary, "check", "rules", str(path)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        click.echo((result.stdout + result.stderr).strip())
        if result.returncode != 0:
            raise AlertRuleError(f"promtool rejected {path}")
    elif promtool:
        click.echo("promtool not found: skipped (apt-get install prometheus)")


@command.command("run")
@click.option("--metrics-url", required=True, help="the runtime's /metrics URL")
@click.option(
    "--interval",
    "interval_s",
    type=Finite(0.0, 86_400.0, min_open=True),
    default=15.0,
    show_default=True,
    help="seconds between samples/evaluations",
)
@click.option("--rules", "rules_path", type=click.Path(path_type=Path), default=None)
@click.option("--webhook", "webhook_url", default=None, help="Alertmanager-style webhook URL")
@click.option(
    "--alertmanager",
    "alertmanager_url",
    default=None,
    help="Alertmanager base URL (alerts go to its /api/v2/alerts)",
)
@click.option(
    "--time-scale",
    type=Finite(0.0, 1e6, min_open=True),
    default=1.0,
    show_default=True,
    help="multiply every for:/range window (demos shorten them)",
)
@click.option(
    "--rounds", type=Bounded(0, 10**9), default=0, help="stop after N rounds (0: until Ctrl-C)"
)
def run(
    metrics_url: str,
    interval_s: float,
    rules_path: Path | None,
    webhook_url: str | None,
    alertmanager_url: str | None,
    time_scale: float,
    rounds: int,
) -> None:
    """Evaluate the rules against a runtime's /metrics until Ctrl-C.

    \b
    Example:
      fastllm alerts run --metrics-url http://127.0.0.1:8000/metrics --interval 5
    """
    from alerts.evaluator import AlertEvaluator, EvaluatorConfig
    from alerts.notifiers import build_notifiers
    from alerts.sources import UrlSource

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if interval_s <= 0 or time_scale <= 0:
        raise click.BadParameter("--interval and --time-scale must be positive")
    config = EvaluatorConfig(interval_s=interval_s, rules_path=rules_path, time_scale=time_scale)
    notifiers = build_notifiers(
        webhook_url=webhook_url,
        alertmanager_url=alertmanager_url,
        external_url=metrics_url.rsplit("/", 1)[0],
        valid_for_s=4 * max(60.0, interval_s),
    )
    evaluator = AlertEvaluator(config, UrlSource(metrics_url), notifiers=notifiers)
    click.echo(
        f"evaluating {sum(len(g.rules) for g in evaluator.groups)} rules against "
        f"{metrics_url} every {interval_s}s (Ctrl-C stops)"
    )
    stop = threading.Event()
    done = 0
    try:
        while not stop.is_set():
            for tr in evaluator.tick():
                click.echo(f"{tr.state:8s} {tr.alert.name} {tr.alert.labels}")
            done += 1
            if rounds and done >= rounds:
                break
            stop.wait(interval_s)
    except KeyboardInterrupt:
        click.echo("stopped")
    finally:
        evaluator.stop()
    firing = evaluator.manager.alerts()
    click.echo(f"{len(firing)} alert(s) firing: {', '.join(a.name for a in firing) or '-'}")


@command.command("export")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["prometheus-rule"]),
    required=True,
    help="prometheus-rule: a prometheus-operator PrometheusRule of alerts/rules/*.yml",
)
@out_options
@click.pass_context
def export(ctx: click.Context, fmt: str, out_path: Path | None, check: bool) -> None:
    """Export the rules for another runner (Kubernetes: deploy/k8s/base/prometheus-rule.yaml).

    \b
    Example:
      fastllm alerts export --format prometheus-rule --out deploy/k8s/base/prometheus-rule.yaml
      fastllm alerts export --format prometheus-rule --check --out FILE
    """
    from alerts import export as exporter

    write_or_check(ctx, out_path, check, exporter.prometheus_rule, exporter.check)
