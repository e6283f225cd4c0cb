"""Batching: is the device in its utilization band, and is the adaptive limit tracking it?"""

from grafanalib.core import Stat, TimeSeries

from dashboards.common import (
    INSTANCE_SEL,
    MODEL_SEL,
    PROMETHEUS,
    RATE,
    bar_gauge,
    make_dashboard,
    prom,
    quantiles,
)

UTILIZATION = f"fastllm_device_utilization_ratio{{{INSTANCE_SEL}}}"
# Alerts fire below 50% and above 90% for 5 minutes; the controller aims for 60-80% by default and
# 70-80% is the band operators want to see. Drawn as coloured bands on the utilization panel.
UTILIZATION_STEPS = [
    {"color": "blue", "value": None},
    {"color": "yellow", "value": 0.5},
    {"color": "green", "value": 0.7},
    {"color": "orange", "value": 0.8},
    {"color": "red", "value": 0.9},
]
BATCH_BUCKETS = f"sum by (le) (rate(fastllm_batch_size_bucket{{{MODEL_SEL}}}[{RATE}]))"
LIMIT = f"max(fastllm_batch_size_limit{{{MODEL_SEL}}})"

dashboard = make_dashboard(
    uid="fastllm-batching",
    title="fastllm / Batching",
    description="Device utilization against the 50/70/80/90% thresholds, batch sizes against the "
    "adaptive limit, queue wait and work stealing.",
    rows=[
        (
            9,
            [
                (
                    18,
                    TimeSeries(
                        title="Device utilization",
                        description="NVML on CUDA, engine busy fraction on CPU. Below 50% or "
                        "above 90% for 5 minutes raises an alert; 70-80% is the target band.",
                        dataSource=PROMETHEUS,
                        targets=[prom(UTILIZATION, "{{device}} {{instance}}")],
                        unit="percentunit",
                        valueMin=0,
                        valueMax=1,
                        thresholds=UTILIZATION_STEPS,
                        thresholdsStyleMode="line+area",
                        legendCalcs=["lastNotNull", "mean"],
                    ),
                ),
                (
                    6,
                    Stat(
                        color={"mode": "thresholds"},
                        title="Utilization now",
                        dataSource=PROMETHEUS,
                        targets=[prom(f"avg({UTILIZATION})")],
                        format="percentunit",
                        reduceCalc="lastNotNull",
                        colorMode="background",
                        thresholds=UTILIZATION_STEPS,
                        extraJson={"fieldConfig": {"defaults": {"min": 0, "max": 1}}},
                    ),
                ),
            ],
        ),
        (
            8,
            [
                (
                    14,
                    TimeSeries(
                        title="Batch size vs adaptive limit",
                        description="Sequences per engine step (p50, p99, mean) under the limit "
                        "the policy sets. The limit grows while utilization is low and shrinks "
                        "while it is high; batches pinned at the limit mean it is binding.",
                        dataSource=PROMETHEUS,
                        targets=[
                            prom(f"histogram_quantile(0.5, {BATCH_BUCKETS})", "p50", "A"),
                            prom(f"histogram_quantile(0.99, {BATCH_BUCKETS})", "p99", "B"),
                            prom(
                                f"sum(rate(fastllm_batch_size_sum{{{MODEL_SEL}}}[{RATE}])) / "
                                f"sum(rate(fastllm_batch_size_count{{{MODEL_SEL}}}[{RATE}]))",
                                "mean",
                                "C",
                            ),
                            prom(LIMIT, "limit", "D"),
                        ],
                        unit="short",
                        legendCalcs=["lastNotNull", "max"],
                    ),
                ),
                (
                    10,
                    bar_gauge(
                        "Batch size distribution",
                        "Engine steps in the selected range with at most `le` sequences "
                        "(cumulative histogram buckets).",
                        [
                            prom(
                                "sum by (le) (increase(fastllm_batch_size_bucket"
                                f"{{{MODEL_SEL}}}[$__range]))",
                                "<= {{le}}",
                                instant=True,
                            )
                        ],
                        unit="short",
                        steps=[{"color": "green", "value": None}],
                    ),
                ),
            ],
        ),
        (
            8,
            [
                (
                    10,
                    TimeSeries(
                        title="Queue wait (p50 / p99)",
                        description="Admission to first schedule. Bounded by FIFO order plus "
                        "aging; a growing p99 with a flat p50 means a few requests starve.",
                        dataSource=PROMETHEUS,
                        targets=quantiles("fastllm_request_queue_seconds"),
                        unit="s",
                    ),
                ),
                (
                    7,
                    TimeSeries(
                        title="Waiting requests",
                        dataSource=PROMETHEUS,
                        targets=[
                            prom(
                                f"sum(fastllm_num_requests_waiting{{{MODEL_SEL}}})",
                                "waiting",
                            )
                        ],
                        unit="short",
                    ),
                ),
                (
                    7,
                    TimeSeries(
                        title="Work steals/s",
                        description="An idle worker taking work from the busiest one. Steady "
                        "steals mean the replicas' queues are unbalanced.",
                        dataSource=PROMETHEUS,
                        targets=[
                            prom(
                                f"sum(rate(fastllm_scheduler_steals_total{{{INSTANCE_SEL}}}"
                                f"[{RATE}]))",
                                "steals",
                            )
                        ],
                        unit="ops",
                    ),
                ),
            ],
        ),
    ],
)
