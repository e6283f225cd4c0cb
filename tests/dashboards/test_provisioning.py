"""Grafana provisioning files and the PostgreSQL read-only role (run against a real server)."""

from __future__ import annotations

import os
import subprocess

import psycopg
import pytest
import yaml

from storage.db import make_engine, upgrade
from tests.dashboards.support import INIT_SCRIPT, ROOT, TEST_PASSWORD, dsn, run_init_script

PROVISIONING = ROOT / "deploy/grafana/provisioning"


def test_datasources_by_uid_without_secrets() -> None:
    text = (PROVISIONING / "datasources/fastllm.yml").read_text()
    sources = {d["uid"]: d for d in yaml.safe_load(text)["datasources"]}
    assert set(sources) == {"prometheus", "postgres", "jaeger"}
    assert sources["prometheus"]["type"] == "prometheus"
    assert sources["prometheus"]["url"] == "http://prometheus:9090"
    assert sources["jaeger"]["type"] == "jaeger"
    assert sources["jaeger"]["url"] == "http://jaeger:16686"
    pg = sources["postgres"]
    assert pg["type"] == "postgres" and pg["url"] == "postgres:5432"
    assert pg["user"] == "grafana_ro" and pg["jsonData"]["database"] == "fastllm"
    assert pg["secureJsonData"] == {"password": "${GRAFANA_PG_PASSWORD}"}  # from the environment
    assert "password" not in pg and "password" not in pg["jsonData"]


def test_dashboard_provider_points_at_the_mounted_generated_folder() -> None:
    providers = yaml.safe_load((PROVISIONING / "dashboards/fastllm.yml").read_text())["providers"]
    assert [p["options"]["path"] for p in providers] == ["/var/lib/grafana/dashboards"]
    assert providers[0]["type"] == "file"


def test_init_script_refuses_to_run_without_a_password(postgres_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRAFANA_PG_PASSWORD"}
    result = subprocess.run(
        ["bash", str(INIT_SCRIPT)], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "GRAFANA_PG_PASSWORD" in result.stderr


def test_read_only_role_reads_tables_created_later_and_cannot_write(postgres_url: str) -> None:
    for _ in range(2):  # idempotent
        result = run_init_script(postgres_url)
        assert result.returncode == 0, result.stderr
    assert TEST_PASSWORD not in INIT_SCRIPT.read_text()
    engine = make_engine(postgres_url)
    try:
        upgrade(engine)  # the runtime's migrations run after init, as the owner role
    finally:
        engine.dispose()
    with psycopg.connect(dsn(postgres_url, "postgres")) as c:
        row = c.execute("SELECT rolpassword FROM pg_authid WHERE rolname = 'grafana_ro'").fetchone()
        assert row is not None and str(row[0]).startswith("SCRAM-SHA-256$")
        flags = (
            "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = 'grafana_ro'"
        )
        assert c.execute(flags).fetchone() == (False, False, False)
    # the role logs in with the password the script set (password auth, as Grafana does) ...
    for wrong in (None, "not the password", TEST_PASSWORD + " "):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(dsn(postgres_url, "grafana_ro", wrong)).close()
    ro = dsn(postgres_url, "grafana_ro", TEST_PASSWORD)
    with psycopg.connect(ro, autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("grafana_ro",)
        assert conn.execute("SELECT COUNT(*) FROM inference_log").fetchone() == (0,)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute(
                "INSERT INTO inference_log (ts, request_id, status) VALUES (now(), 'x', 'stop')"
            )
        conn.execute("SET default_transaction_read_only = off")  # the grants alone also refuse
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO inference_log (ts, request_id, status) VALUES (now(), 'x', 'stop')"
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE grafana_owned (x int)")
