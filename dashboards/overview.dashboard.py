"""Overview: is the service taking traffic, succeeding, and fast enough?"""

from grafanalib.core import Stat, TimeSeries

from dashboards.common import (
    INSTANCE_SEL,
    MODEL_SEL,
    PROMETHEUS,
    RATE,
    make_dashboard,
    or_zero,
    prom,
    quantiles,
)
from dashboards.endpoint_panels import ENDPOINT_ROW
from dashboards.lora_panels import LORA_ROW
from dashboards.structured_panels import STRUCTURED_ROW

SUCCESS = f"sum(rate(fastllm_request_success_total{{{MODEL_SEL}}}[{RATE}]))"
FAILURE = f"sum(rate(fastllm_request_failure_total{{{MODEL_SEL}}}[{RATE}]))"


def stat(
    title: str, expr: str, unit: str = "short", description: str = "", *, instant: bool = False
) -> Stat:
    return Stat(
        color={"mode": "thresholds"},
        title=title,
        description=description,
        dataSource=PROMETHEUS,
        targets=[prom(expr, instant=instant)],
        format=unit,
        reduceCalc="lastNotNull",
        noValue="0",
        thresholds=[{"color": "green", "value": None}],
    )


def total(title: str, metric: str, description: str) -> Stat:
    """A counter's current value summed over the selected series: the number /metrics shows."""
    return stat(title, or_zero(f"sum({metric}{{{MODEL_SEL}}})"), "short", description, instant=True)


def latency(title: str, histogram: str, description: str) -> TimeSeries:
    return TimeSeries(
        title=title,
        description=description,
        dataSource=PROMETHEUS,
        targets=quantiles(histogram),
        unit="s",
        legendCalcs=["lastNotNull", "max"],
    )


dashboard = make_dashboard(
    uid="fastllm-overview",
    title="fastllm / Overview",
    description="Traffic, outcomes, latency (TTFT, TPOT, end to end), throughput, scheduler "
    "state, structured output.",
    rows=[
        (
            4,
            [
                (4, stat("Requests/s", f"{SUCCESS} + {FAILURE}", "reqps")),
                (
                    4,
                    stat(
                        "Success ratio",
                        f"{SUCCESS} / ({SUCCESS} + {FAILURE})",
                        "percentunit",
                        "Share of requests that ended normally (stop, length, cancelled).",
                    ),
                ),
                (
                    4,
                    stat(
                        "Generated tokens/s",
                        f"sum(rate(fastllm_generation_tokens_total{{{MODEL_SEL}}}[{RATE}]))",
                    ),
                ),
                (4, stat("Running", f"sum(fastllm_num_requests_running{{{MODEL_SEL}}})")),
                (4, stat("Waiting", f"sum(fastllm_num_requests_waiting{{{MODEL_SEL}}})")),
                (
                    4,
                    stat(
                        "Targets up",
                        f"sum(up{{{INSTANCE_SEL}}})",
                        description="Runtime instances Prometheus scrapes successfully.",
                    ),
                ),
            ],
        ),
        (
            3,
            [
                (
                    6,
                    total(
                        "Requests succeeded",
                        "fastllm_request_success_total",
                        "Since the runtime started (counters restart with the process).",
                    ),
                ),
                (
                    6,
                    total(
                        "Requests failed",
                        "fastllm_request_failure_total",
                        "Validation errors, admission refusals, timeouts and internal errors.",
                    ),
                ),
                (
                    6,
                    total(
                        "Prompt tokens", "fastllm_prompt_tokens_total", "Prompt tokens processed."
                    ),
                ),
                (
                    6,
                    total(
                        "Generated tokens", "fastllm_generation_tokens_total", "Tokens generated."
                    ),
                ),
            ],
        ),
        (
            8,
            [
                (
                    8,
                    TimeSeries(
                        title="Request rate",
                        description="Requests finished per second, successes and failures.",
                        dataSource=PROMETHEUS,
                        targets=[prom(SUCCESS, "success", "A"), prom(FAILURE, "failure", "B")],
                        unit="reqps",
                    ),
                ),
                (
                    8,
                    TimeSeries(
                        title="Successes by finished_reason",
                        description="stop = model ended; length = hit max_tokens; cancelled = "
                        "client went away.",
                        dataSource=PROMETHEUS,
                        targets=[
                            prom(
                                "sum by (finished_reason) (rate(fastllm_request_success_total"
                                f"{{{MODEL_SEL}}}[{RATE}]))",
                                "{{finished_reason}}",
                            )
                        ],
                        unit="reqps",
                        stacking={"mode": "normal", "group": "A"},
                        fillOpacity=30,
                    ),
                ),
                (
                    8,
                    TimeSeries(
                        title="Failures by reason",
                        description="validation = bad request (client); unauthorized = no or "
                        "a wrong API key (no inference_log row); overloaded = 429/503 "
                        "admission refusals; timeout and internal are the service's own.",
                        dataSource=PROMETHEUS,
                        targets=[
                            prom(
                                "sum by (reason) (rate(fastllm_request_failure_total"
                                f"{{{MODEL_SEL}}}[{RATE}]))",
                                "{{reason}}",
                            )
                        ],
                        unit="reqps",
                        stacking={"mode": "normal", "group": "A"},
                        fillOpacity=30,
                    ),
                ),
            ],
        ),
        (
            8,
            [
                (
                    8,
                    latency(
                        "Time to first token (p50 / p95 / p99)",
                        "fastllm_time_to_first_token_seconds",
                        "Admission to first generated token: queueing plus prefill.",
                    ),
                ),
                (
                    8,
                    latency(
                        "Time per output token (p50 / p95 / p99)",
                        "fastllm_time_per_output_token_seconds",
                        "Mean decode time per token after the first: what streaming users feel.",
                    ),
                ),
                (
                    8,
                    latency(
                        "End-to-end latency (p50 / p95 / p99)",
                        "fastllm_e2e_request_latency_seconds",
                        "Admission to the end of the request.",
                    ),
                ),
            ],
        ),
        (
            8,
            [
                (
                    12,
                    TimeSeries(
                        title="Tokens/s",
                        description="Prompt tokens processed and tokens generated per second.",
                        dataSource=PROMETHEUS,
                        targets=[
                            prom(
                                f"sum(rate(fastllm_prompt_tokens_total{{{MODEL_SEL}}}[{RATE}]))",
                                "prompt",
                                "A",
                            ),
                            prom(
                                "sum(rate(fastllm_generation_tokens_total"
                                f"{{{MODEL_SEL}}}[{RATE}]))",
                                "generated",
                                "B",
                            ),
                        ],
                        unit="short",
                    ),
                ),
                (
                    12,
                    TimeSeries(
                        title="Running and waiting requests",
                        description="Running = in the batch; waiting = admitted, not yet "
                        "scheduled. Waiting that keeps rising means the batch limit or KV space "
                        "is the bottleneck.",
                        dataSource=PROMETHEUS,
                        targets=[
                            prom(
                                f"sum by (model, version) (fastllm_num_requests_running"
                                f"{{{MODEL_SEL}}})",
                                "running {{model}}/{{version}}",
                                "A",
                            ),
                            prom(
                                f"sum by (model, version) (fastllm_num_requests_waiting"
                                f"{{{MODEL_SEL}}})",
                                "waiting {{model}}/{{version}}",
                                "B",
                            ),
                        ],
                        unit="short",
                    ),
                ),
            ],
        ),
        STRUCTURED_ROW,
        ENDPOINT_ROW,
        LORA_ROW,
    ],
)
