"""Engines and migrations. `make_engine(url)` knows the two databases we run on: SQLite (the
embedded default; WAL + busy timeout so the writer thread and readers do not trip over each other)
and PostgreSQL (compose). `upgrade(engine)` applies the Alembic migrations shipped in the package.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy.exc import NoSuchModuleError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from storage.errors import StorageError

log = logging.getLogger("fastllm.storage")

SQLITE_BUSY_TIMEOUT_MS = 5000
MIGRATIONS = "storage:migrations"  # package-resource form: works from a wheel too


def _is_memory_sqlite(database: str | None) -> bool:
    return not database or database == ":memory:" or database.startswith("file::memory:")


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An Engine for `url`; for a SQLite file, its parent directory is created."""
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError/ValueError
        raise StorageError(f"invalid database_url {url!r}: {exc}") from exc
    shown = parsed.render_as_string(hide_password=True)
    try:
        if parsed.get_backend_name() == "sqlite":
            return _sqlite_engine(url, parsed.database, **kwargs)
        kwargs.setdefault("pool_pre_ping", True)  # reconnect transparently after a restart
        if parsed.get_backend_name() == "postgresql":
            kwargs.setdefault("connect_args", {"connect_timeout": 5})
        return create_engine(url, **kwargs)
    except (NoSuchModuleError, ImportError) as exc:  # unknown scheme, driver not installed
        raise StorageError(f"no database driver for {shown!r} ({exc})") from exc
    except OSError as exc:  # the SQLite file's directory cannot be created
        raise StorageError(f"cannot use the SQLite file of {shown!r}: {exc}") from exc


def _sqlite_engine(url: str, database: str | None, **kwargs: Any) -> Engine:
    connect_args = kwargs.pop("connect_args", {})
    connect_args.setdefault("timeout", SQLITE_BUSY_TIMEOUT_MS / 1000)
    connect_args.setdefault("check_same_thread", False)
    if _is_memory_sqlite(database):
        # one shared connection, otherwise each thread would see its own empty database
        kwargs.setdefault("poolclass", StaticPool)
    else:
        Path(str(database)).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args=connect_args, **kwargs)
    is_file = not _is_memory_sqlite(database)

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        if is_file:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; fine for logs
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()

    return engine


def alembic_config(engine: Engine | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", MIGRATIONS)
    if engine is not None:
        config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    return config


def begin_ddl(connection: Connection) -> None:
    """Make the migrations one transaction on SQLite. Python's sqlite3 module opens a transaction
    only before DML, so each CREATE/ALTER of a migration committed on its own: a server stopped or
    locked out halfway left tables without the `alembic_version` stamp, and every later start then
    failed on "table inference_log already exists". An explicit BEGIN IMMEDIATE (sqlite3 adds
    none of its own once one is open) takes the write lock first, so two servers starting on one
    file migrate one after the other. PostgreSQL's DDL is transactional already."""
    if connection.dialect.name != "sqlite":
        return
    if not getattr(connection.connection.dbapi_connection, "in_transaction", False):
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply migrations up to `revision` (idempotent, all or nothing). Raises StorageError when
    it cannot."""
    config = alembic_config(engine)
    try:
        with engine.begin() as connection:
            begin_ddl(connection)
            config.attributes["connection"] = connection
            before = MigrationContext.configure(connection).get_current_revision()
            command.upgrade(config, revision)
            after = MigrationContext.configure(connection).get_current_revision()
    except SQLAlchemyError as exc:
        raise StorageError(f"cannot migrate {engine.url!r}: {exc}") from exc
    except CommandError as exc:  # an unknown target, or a database stamped by another version
        url = engine.url.render_as_string(hide_password=True)
        raise StorageError(f"cannot migrate {url} to revision {revision!r}: {exc}") from exc
    # one INFO line when the schema moved; every later (idempotent) call is debug-only
    level = logging.INFO if before != after else logging.DEBUG
    log.log(
        level,
        "database %s: migrations applied (%s -> %s)",
        engine.url.render_as_string(hide_password=True),
        before,
        after,
    )


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def open_database(url: str, *, migrate: bool = True, **kwargs: Any) -> Engine:
    """`make_engine` + `upgrade` (what `serve` does on start)."""
    engine = make_engine(url, **kwargs)
    if migrate:
        upgrade(engine)
    return engine
