"""Alembic environment. Runs online only: `storage.db.upgrade` hands over an open connection
(config.attributes["connection"]); the `alembic` CLI path builds one from sqlalchemy.url."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from storage.db import begin_ddl, make_engine
from storage.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    # batch mode lets ALTERs work on SQLite (copy-and-move) and is a no-op on PostgreSQL
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no connection and no sqlalchemy.url for the migrations")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            begin_ddl(conn)
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) migrations are not supported; run `fastllm db upgrade`")
run_migrations_online()
