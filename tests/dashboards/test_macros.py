"""Grafana variable / macro expansion used by the live tests."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from dashboards.macros import UnexpandedMacro, expand_promql, expand_sql

START = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
END = datetime(2026, 1, 2, 4, 4, 5, tzinfo=timezone.utc)


def test_promql_variables_are_regex_escaped_inside_the_string_literal() -> None:
    expr = 'rate(x{instance=~"$instance", model=~"${model}"}[$__rate_interval])'
    out = expand_promql(expr, {"instance": "127.0.0.1:9", "model": "m"}, rate_interval="30s")
    assert out == r'rate(x{instance=~"127\\.0\\.0\\.1:9", model=~"m"}[30s])'


def test_promql_builtin_ranges() -> None:
    out = expand_promql("increase(x[$__range]) + y[${__interval}]", {}, range_="2h", interval="5s")
    assert out == "increase(x[2h]) + y[5s]"


def test_sql_macros_follow_grafana_postgres() -> None:
    sql = (
        "SELECT $__timeGroupAlias(ts, $__interval), $__timeGroup(ts, '5m') AS g, $__time(ts) "
        "FROM t WHERE $__timeFilter(ts) AND a > $threshold AND m ~ '^${model:regex}$' "
        "AND ts > $__timeFrom() AND ts < $__timeTo()"
    )
    out = expand_sql(
        sql, {"threshold": "0.001", "model": "tiny.v1"}, start=START, end=END, interval_s=60
    )
    assert out == (
        'SELECT floor(extract(epoch from ts)/60)*60 AS "time", '
        'floor(extract(epoch from ts)/300)*300 AS g, ts AS "time" '
        "FROM t WHERE ts BETWEEN '2026-01-02T03:04:05Z' AND '2026-01-02T04:04:05Z' "
        "AND a > 0.001 AND m ~ '^tiny\\.v1$' "
        "AND ts > '2026-01-02T03:04:05Z' AND ts < '2026-01-02T04:04:05Z'"
    )


@pytest.mark.parametrize(
    "sql", ["SELECT $__unixEpochFilter(ts)", "SELECT $unknown", "SELECT ${model:csv}"]
)
def test_unknown_macros_and_variables_fail_loudly(sql: str) -> None:
    with pytest.raises(UnexpandedMacro):
        expand_sql(sql, {"model": "m"}, start=START, end=END)


def test_unknown_promql_variable_fails_loudly() -> None:
    with pytest.raises(UnexpandedMacro):
        expand_promql('x{a=~"$nope"}', {})
