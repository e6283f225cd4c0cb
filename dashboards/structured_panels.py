"""The overview's structured-output row: constrained request rate by kind, grammar compile time,
the compiled-grammar cache hit ratio, and outputs that ended before their grammar did."""

from grafanalib.core import TimeSeries

from dashboards.common import MODEL_SEL, PROMETHEUS, RATE, prom, quantiles

_HITS = f"sum(rate(fastllm_grammar_cache_hits_total{{{MODEL_SEL}}}[{RATE}]))"
_MISSES = f"sum(rate(fastllm_grammar_cache_misses_total{{{MODEL_SEL}}}[{RATE}]))"

STRUCTURED_ROW = (
    8,
    [
        (
            6,
            TimeSeries(
                title="Constrained requests by kind",
                description="Structured output (json, regex, choice, grammar) and forced tool "
                "calls (tools) per second.",
                dataSource=PROMETHEUS,
                targets=[
                    prom(
                        "sum by (kind) (rate(fastllm_constrained_requests_total"
                        f"{{{MODEL_SEL}}}[{RATE}]))",
                        "{{kind}}",
                    )
                ],
                unit="reqps",
            ),
        ),
        (
            6,
            TimeSeries(
                title="Grammar compile time (p50 / p95 / p99)",
                description="Compiles a request waited for (cache misses). They run off the "
                "engine loop: other requests do not wait for them.",
                dataSource=PROMETHEUS,
                targets=quantiles("fastllm_grammar_compile_seconds"),
                unit="s",
            ),
        ),
        (
            6,
            TimeSeries(
                title="Grammar cache hit ratio",
                description="Constrained requests whose compiled grammar was cached.",
                dataSource=PROMETHEUS,
                targets=[prom(f"{_HITS} / ({_HITS} + {_MISSES})", "hit ratio")],
                unit="percentunit",
            ),
        ),
        (
            6,
            TimeSeries(
                title="Outputs ended before the grammar",
                description="Constrained outputs cut by max_tokens or a stop string: they may "
                "not parse. Raise max_tokens or bound the schema.",
                dataSource=PROMETHEUS,
                targets=[
                    prom(
                        f"sum(rate(fastllm_grammar_incomplete_total{{{MODEL_SEL}}}[{RATE}]))",
                        "incomplete",
                    )
                ],
                unit="reqps",
            ),
        ),
    ],
)
