"""Every PromQL expression (and variable selector) of the dashboards parses in a real Prometheus:
an instant query on an empty server answers a syntax error with `bad_data`."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dashboards.macros import expand_promql
from dashboards.queries import PROMQL, all_queries, variable_queries
from tests.fixtures.prometheus import PromHandle, PromQueryError

VALUES = {"model": "tiny", "version": "stable", "instance": "127.0.0.1:8000"}


def test_every_expression_parses(prometheus_server: Callable[..., PromHandle]) -> None:
    prom = prometheus_server([])
    with pytest.raises(PromQueryError, match="parse error"):  # the check can fail
        prom.query("sum(rate(fastllm_batch_size_count[5m])")
    errors = []
    queries = [q for q in all_queries() if q.kind == PROMQL]
    assert len(queries) > 20
    for query in queries:
        expr = expand_promql(query.text, VALUES)
        try:
            prom.query(expr)
        except PromQueryError as exc:
            errors.append(f"{query.where}: {exc}")
    for variable in variable_queries():
        selector = expand_promql(variable.selector, VALUES)
        try:
            prom.api("series", **{"match[]": selector})
        except PromQueryError as exc:
            errors.append(f"{variable.dashboard} variable {variable.name}: {exc}")
    assert not errors, "\n".join(errors)
