"""`fastllm db`: apply the storage migrations, show the schema revision, prune old rows."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from runtime.cli.params import Bounded, Finite
from runtime.config import load_settings
from storage.errors import StorageError

if TYPE_CHECKING:
    from sqlalchemy import Engine

database_url_option = click.option(
    "--database-url", default=None, help="default: settings.database_url (FASTLLM_DATABASE_URL)"
)


@contextmanager
def _engine(database_url: str | None) -> Iterator[Engine]:
    """An engine for the flag or the settings; database errors become StorageError (exit 2)."""
    from sqlalchemy.exc import SQLAlchemyError

    from storage.db import make_engine

    engine = make_engine(database_url or load_settings().database_url)
    try:
        yield engine
    except SQLAlchemyError as exc:
        raise StorageError(f"database error: {exc}") from exc
    finally:
        engine.dispose()


@click.group("db")
def command() -> None:
    """Database schema and maintenance.

    \b
    Example:
      fastllm db upgrade --database-url sqlite:///var/fastllm.db
      fastllm db prune --retention-days 30
    """


@command.command("upgrade")
@database_url_option
@click.option("--revision", default="head", show_default=True, help="target Alembic revision")
def upgrade_cmd(database_url: str | None, revision: str) -> None:
    """Apply migrations up to REVISION (idempotent; `serve` does this on start)."""
    from storage.db import current_revision, upgrade

    with _engine(database_url) as engine:
        upgrade(engine, revision)
        click.echo(f"database at revision {current_revision(engine)}")


@command.command("current")
@database_url_option
def current_cmd(database_url: str | None) -> None:
    """Print the applied revision and the newest one shipped."""
    from storage.db import current_revision, head_revision

    with _engine(database_url) as engine:
        click.echo(f"current: {current_revision(engine) or 'none'}  head: {head_revision()}")


@command.command("prune")
@database_url_option
@click.option(
    "--retention-days",
    type=Finite(0.0, 36_500.0, min_open=True),
    default=None,
    help="default: settings.retention_days",
)
@click.option("--batch-size", type=Bounded(1, 10**7), default=1000, show_default=True)
def prune_cmd(database_url: str | None, retention_days: float | None, batch_size: int) -> None:
    """Delete rows older than the retention window, in batches."""
    from storage.retention import prune

    with _engine(database_url) as engine:
        deleted = prune(engine, retention_days or load_settings().retention_days, batch_size)
    for table, n in deleted.items():
        click.echo(f"{table}: {n} rows deleted")
