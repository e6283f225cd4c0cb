"""Helpers shared by the dashboard tests: the compose PostgreSQL init script, run the way the
postgres image runs it, and the DSN of the read-only role it creates."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from psycopg.conninfo import make_conninfo
from sqlalchemy import make_url

from tests.conftest import require_binary

ROOT = Path(__file__).resolve().parents[2]
INIT_SCRIPT = ROOT / "deploy/postgres/init/10-grafana-readonly.sh"
TEST_PASSWORD = 'it\'s a "test"; DROP ROLE grafana_ro; --'


def run_init_script(url: str, password: str = TEST_PASSWORD) -> subprocess.CompletedProcess[str]:
    """As POSTGRES_USER in POSTGRES_DB, with GRAFANA_PG_PASSWORD in the environment."""
    require_binary("psql")
    parts = make_url(url)
    env = {
        **os.environ,
        "PGHOST": parts.host or "127.0.0.1",
        "PGPORT": str(parts.port),
        "POSTGRES_USER": parts.username or "postgres",
        "POSTGRES_DB": parts.database or "postgres",
        "GRAFANA_PG_PASSWORD": password,
    }
    return subprocess.run(
        ["bash", str(INIT_SCRIPT)], env=env, capture_output=True, text=True, timeout=60
    )


def dsn(url: str, user: str, password: str | None = None) -> str:
    """libpq DSN for `user` on the database of a SQLAlchemy URL. The test cluster trusts loopback
    except for grafana_ro, which logs in with its password as in compose (PASSWORD_ROLES)."""
    parts = make_url(url)
    fields = {"host": parts.host, "port": parts.port, "user": user, "dbname": parts.database}
    if password is not None:
        fields["password"] = password
    return make_conninfo(**fields)  # quotes the password (quotes, spaces, backslashes)
