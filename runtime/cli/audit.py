"""`fastllm audit`: count verified results whose production value strays from the reference
value (the operations guide's query), per op, with the worst recent rows."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import click

from runtime.cli.params import Bounded, Finite
from runtime.config import load_settings
from runtime.errors import ConfigError
from storage.errors import StorageError

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


MAX_SINCE_S = 36_500 * 86_400.0


def parse_since(value: str) -> timedelta:
    """Parse "90s", "15m", "1h", "7d", "2w" → timedelta."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", value)
    if match is None:
        raise ConfigError(f"--since {value!r}: expected a number and a unit s/m/h/d/w, e.g. 1h")
    seconds = float(match.group(1)) * _UNITS_S[match.group(2)]
    if seconds > MAX_SINCE_S:  # beyond it, now - since is before year 1 (an OverflowError)
        raise ConfigError(f"--since {value!r}: at most 100 years (36500d)", param="since")
    return timedelta(seconds=seconds)


@click.command("audit")
@click.option(
    "--threshold",
    type=Finite(0.0, 1e30),
    default=None,
    help="one absolute error for every row (the guide's query); default: each row against the "
    "tolerance recorded with it, settings.verify_threshold or the dtype's default "
    "(float32 1e-3, float16 1e-2, bfloat16 5e-2) where none was",
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16", "bfloat16"]),
    default=None,
    help="dtype whose default threshold applies (default: settings.dtype)",
)
@click.option("--since", default=None, help="only rows newer than this, e.g. 30m, 1h, 7d")
@click.option("--op", default=None, help="only this op: logit, geglu, swiglu, rms_norm, ...")
@click.option(
    "--max-anomalies",
    type=Bounded(0, 2**62),
    default=0,
    show_default=True,
    help="exit 1 when more anomalies than this",
)
@click.option(
    "--limit",
    "num_worst",
    type=Bounded(0, 10_000),
    default=10,
    show_default=True,
    help="worst rows to show",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    help="only this model's rows (repeatable); default: the served name of the model the "
    "settings configure (FASTLLM_MODEL_PATH / FASTLLM_MODEL_NAME or the YAML file), every model "
    "when none is configured",
)
@click.option(
    "--instance",
    default=None,
    help="only rows of this server (host:port); default: every server",
)
@click.option(
    "--all-models",
    is_flag=True,
    help="every model's rows (servers sharing the database), not only the configured one",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of tables")
@click.option("--database-url", default=None, help="default: settings.database_url")
@click.pass_context
def command(
    ctx: click.Context,
    threshold: float | None,
    dtype: str | None,
    since: str | None,
    op: str | None,
    max_anomalies: int,
    num_worst: int,
    models: tuple[str, ...],
    instance: str | None,
    all_models: bool,
    as_json: bool,
    database_url: str | None,
) -> None:
    """Audit verified results: SELECT COUNT(*) FROM inference_log WHERE ABS(output - expected) >
    :threshold, per op, with the worst rows. Exits 1 when anomalies exceed --max-anomalies.

    \b
    Example:
      fastllm audit --since 1h
      fastllm audit --op geglu --threshold 0.01 --json
      fastllm audit --all-models --instance 127.0.0.1:8000
    """
    from sqlalchemy.exc import SQLAlchemyError

    from storage.audit import default_threshold, run_audit
    from storage.db import make_engine

    settings = load_settings()
    per_row = threshold is None  # an explicit --threshold is one bound for every row
    if threshold is None:
        threshold = settings.verify_threshold
    if threshold is None:
        threshold = default_threshold(dtype or settings.dtype, settings.quantization)
    if all_models:
        models = ()
    elif not models and {"model_path", "model_name"} & settings.model_fields_set:
        models = (settings.served_model_name,)  # the model this configuration serves
    since_ts = datetime.now(timezone.utc) - parse_since(since) if since else None
    engine = make_engine(database_url or settings.database_url)
    try:
        report = run_audit(
            engine,
            threshold,
            since=since_ts,
            op=op,
            num_worst=num_worst,
            per_row=per_row,
            models=models,
            instance=instance,
        )
    except SQLAlchemyError as exc:
        raise StorageError(f"audit failed (run `fastllm db upgrade` first?): {exc}") from exc
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        from runtime.cli.audit_view import print_report

        print_report(report, max_anomalies)
    if report.num_anomalies > max_anomalies:
        ctx.exit(1)
