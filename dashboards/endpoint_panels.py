"""The overview's per-endpoint row (issue 38): request counts, rates, service failures and p95
time to first token by the API a request came through (`endpoint`: completions, chat,
responses, messages, embeddings), so agent clients on /v1/responses or /v1/messages are seen
apart from chat traffic. The status page draws it too (runtime.server.status.catalog)."""

from grafanalib.core import TimeSeries

from dashboards.common import MODEL_SEL, PROMETHEUS, RATE, bar_gauge, prom

_BY_ENDPOINT = "sum by (endpoint) (rate({name}{{{sel}}}[{rate}]))"
_REQUESTS = " + ".join(
    _BY_ENDPOINT.format(name=name, sel=MODEL_SEL, rate=RATE)
    for name in ("fastllm_request_success_total", "fastllm_request_failure_total")
)
_FAILURES = _BY_ENDPOINT.format(
    name="fastllm_request_failure_total",
    sel=MODEL_SEL + ', reason!~"validation|unauthorized"',
    rate=RATE,
)
# requests finished in the selected range per endpoint: the counts the status page shows
_COUNTS = " + ".join(
    f"sum by (endpoint) (increase({name}{{{MODEL_SEL}}}[$__range]))"
    for name in ("fastllm_request_success_total", "fastllm_request_failure_total")
)
_TTFT = (
    "histogram_quantile(0.95, sum by (endpoint, le) "
    f"(rate(fastllm_time_to_first_token_seconds_bucket{{{MODEL_SEL}}}[{RATE}])))"
)

ENDPOINT_ROW = (
    8,
    [
        (
            6,
            bar_gauge(
                "Requests per endpoint",
                "Requests finished in the selected range (successes and failures) by API.",
                [prom(_COUNTS, "{{endpoint}}", instant=True)],
                unit="short",
                steps=[{"color": "blue", "value": None}],
            ),
        ),
        (
            6,
            TimeSeries(
                title="Requests by endpoint",
                description="Requests finished per second (successes and failures) by API: "
                "completions, chat, responses (OpenAI Responses), messages (Anthropic Messages), "
                "embeddings.",
                dataSource=PROMETHEUS,
                targets=[prom(_REQUESTS, "{{endpoint}}")],
                unit="reqps",
                stacking={"mode": "normal", "group": "A"},
                fillOpacity=30,
            ),
        ),
        (
            6,
            TimeSeries(
                title="Service failures by endpoint",
                description="Overloaded, timeout and internal failures per second by API "
                "(validation and unauthorized are the client's).",
                dataSource=PROMETHEUS,
                targets=[prom(_FAILURES, "{{endpoint}}")],
                unit="reqps",
            ),
        ),
        (
            6,
            TimeSeries(
                title="Time to first token p95 by endpoint",
                description="Admission to first token, per API (agents' prompts are long: "
                "their TTFT is mostly prefill).",
                dataSource=PROMETHEUS,
                targets=[prom(_TTFT, "{{endpoint}}")],
                unit="s",
            ),
        ),
    ],
)
