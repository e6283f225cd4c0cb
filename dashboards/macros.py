"""Expand what Grafana expands before a query reaches its datasource, so tests can run the
dashboards' queries against a real Prometheus or PostgreSQL:

    expand_promql(expr, {"model": "tiny"}, rate_interval="1m", range_="1h")
    expand_sql(sql, {"threshold": "0.001", "model": "tiny"}, start=..., end=..., interval_s=60)

Template variables: `$name`, `${name}`, `${name:regex}`. Values are escaped the way Grafana does
for multi-value variables (regex metacharacters; in PromQL the backslash doubled for the string
literal). SQL macros follow Grafana's PostgreSQL datasource. Anything left unexpanded raises
`UnexpandedMacro`, so a panel using a macro this module does not know fails loudly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime, timezone

_PROM_META = re.compile(r"[$^*{}\[\]'+?.()|\\]")
_SQL_REGEX_META = re.compile(r"[.*+?^${}()|\[\]\\]")
_LEFTOVER = re.compile(r"\$(?:\{\w+(?::\w+)?\}|__\w+|[A-Za-z_]\w*)")
_SUFFIXES = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class UnexpandedMacro(ValueError):
    pass


def _substitute(text: str, values: Mapping[str, str], escape: Callable[[str], str]) -> str:
    def braced(match: re.Match[str]) -> str:
        name, fmt = match["name"], match["fmt"]
        if name not in values:
            return match.group()
        if fmt == "regex":
            return _SQL_REGEX_META.sub(lambda m: "\\" + m.group(), values[name])
        if fmt not in (None, "raw"):
            raise UnexpandedMacro(f"variable format {fmt!r} in {match.group()}")
        return values[name] if fmt == "raw" else escape(values[name])

    text = re.sub(r"\$\{(?P<name>\w+)(?::(?P<fmt>\w+))?\}", braced, text)
    for name in sorted(values, key=len, reverse=True):  # $versions before $version
        value = escape(values[name])
        text = re.sub(rf"\${name}\b", lambda _m: value, text)  # noqa: B023 (used at once)
    return text


def _check(text: str) -> str:
    leftover = _LEFTOVER.findall(text)
    if leftover:
        raise UnexpandedMacro(f"unexpanded {sorted(set(leftover))} in: {text}")
    return text


def expand_promql(
    expr: str,
    values: Mapping[str, str],
    *,
    rate_interval: str = "1m",
    range_: str = "1h",
    interval: str = "15s",
) -> str:
    builtins = {"__rate_interval": rate_interval, "__range": range_, "__interval": interval}
    for name, value in builtins.items():
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    escaped = _substitute(expr, values, lambda v: _PROM_META.sub(lambda m: "\\\\" + m.group(), v))
    return _check(escaped)


def _seconds(spec: str) -> int:
    spec = spec.strip().strip("'\"")
    if spec.isdigit():
        return int(spec)
    if spec[-1] in _SUFFIXES and spec[:-1].isdigit():
        return int(spec[:-1]) * _SUFFIXES[spec[-1]]
    raise UnexpandedMacro(f"interval {spec!r}")


def _iso(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand_sql(
    sql: str,
    values: Mapping[str, str],
    *,
    start: datetime,
    end: datetime,
    interval_s: int = 60,
) -> str:
    """Grafana PostgreSQL macros: $__timeFilter, $__time, $__timeFrom/To, $__timeGroup(Alias),
    $__interval(_ms); then template variables (plain values, `${x:regex}` regex-escaped)."""
    sql = sql.replace("$__interval_ms", str(interval_s * 1000))
    sql = sql.replace("$__interval", f"{interval_s}s")
    frm, to = f"'{_iso(start)}'", f"'{_iso(end)}'"

    def group(alias: bool) -> Callable[[re.Match[str]], str]:
        def expand(match: re.Match[str]) -> str:
            column, step = match["col"].strip(), _seconds(match["arg"])
            out = f"floor(extract(epoch from {column})/{step})*{step}"
            return out + ' AS "time"' if alias else out

        return expand

    args = r"\(\s*(?P<col>[^,()]+?)\s*,\s*(?P<arg>[^,()]+?)\s*\)"
    sql = re.sub(r"\$__timeGroupAlias" + args, group(True), sql)
    sql = re.sub(r"\$__timeGroup" + args, group(False), sql)
    sql = re.sub(r"\$__timeFilter\(\s*([^()]+?)\s*\)", rf"\1 BETWEEN {frm} AND {to}", sql)
    sql = re.sub(r"\$__time\(\s*([^()]+?)\s*\)", r'\1 AS "time"', sql)
    sql = sql.replace("$__timeFrom()", frm).replace("$__timeTo()", to)
    return _check(_substitute(sql, values, lambda v: v))
