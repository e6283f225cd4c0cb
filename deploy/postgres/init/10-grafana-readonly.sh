#!/usr/bin/env bash
# Creates `grafana_ro`, the read-only role Grafana's PostgreSQL datasource logs in with
# (deploy/grafana/provisioning/datasources/fastllm.yml). The postgres image runs this once, on an
# empty data directory, from /docker-entrypoint-initdb.d as POSTGRES_USER in POSTGRES_DB.
#
# The password comes from GRAFANA_PG_PASSWORD in the container's environment (compose passes the
# same variable to Grafana); it is handed to psql as a variable and quoted by psql (:'...'), so
# any characters are safe. Tables the runtime's migrations create later (inference_log, ...) are
# readable through ALTER DEFAULT PRIVILEGES for the owner role. Safe to run again.
set -euo pipefail

: "${GRAFANA_PG_PASSWORD:?set GRAFANA_PG_PASSWORD (password of the grafana_ro role)}"
database="${POSTGRES_DB:-${POSTGRES_USER:-postgres}}"
owner="${POSTGRES_USER:-postgres}"

psql -v ON_ERROR_STOP=1 --no-psqlrc --quiet \
    --username "$owner" --dbname "$database" \
    -v ro_password="$GRAFANA_PG_PASSWORD" -v db="$database" -v owner="$owner" <<'SQL'
SELECT 'CREATE ROLE grafana_ro LOGIN'
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'grafana_ro') \gexec
ALTER ROLE grafana_ro WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION
    PASSWORD :'ro_password';
-- belt and braces: even a missed grant cannot write
ALTER ROLE grafana_ro SET default_transaction_read_only = on;
ALTER ROLE grafana_ro SET statement_timeout = '30s';
GRANT CONNECT ON DATABASE :"db" TO grafana_ro;
GRANT USAGE ON SCHEMA public TO grafana_ro;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO grafana_ro;
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public GRANT SELECT ON TABLES TO grafana_ro;
SQL
echo "grafana_ro: read-only role ready in database ${database}"
