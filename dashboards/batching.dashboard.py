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
from dashboards.spec_panels import SPEC_ROW

UTILIZATION = f"fastllm_device_utilization_ratio{{{INSTANCE_SEL}}}"
BUSY = f"fastllm_device_busy_ratio{{{INSTANCE_SEL}}}"
# Alerts fire below 50% and above 90% for 5 minutes; the controller holds u in 60-80% by default
# (min_util, max_util) and 70-80% is the band operators want to see. Drawn as coloured bands.
UTILIZATION_STEPS = [
    {"color": "blue", "value": None},
    {"color": "yellow", "value": 0.5},
    {"color": "green", "value": 0.7},
    {"color": "orange", "value": 0.8},
    {"color": "red", "value": 0.9},
]
BUSY_STEPS = [{"color": "text", "value": None}]
BATCH_BUCKETS = f"sum by (le) (rate(fastllm_batch_size_bucket{{{MODEL_SEL}}}[{RATE}]))"
LIMIT = f"max(fastllm_batch_size_limit{{{MODEL_SEL}}})"
# the duty cycle drawn dashed: a cross-check beside u, not the controller's input
BUSY_OVERRIDE = {
    "matcher": {"id": "byFrameRefID", "options": "B"},
    "properties": [
        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
        {"id": "custom.thresholdsStyle", "value": {"mode": "off"}},
    ],
}

dashboard = make_dashboard(
    uid="fastllm-batching",
    title="fastllm / Batching",
    description="Utilization (the share of saturation throughput the engine delivers) against "
    "the 50/70/80/90% thresholds and the busy ratio, batch sizes against the adaptive limit, "
    "queue wait and work stealing.",
    rows=[
        (
            9,
            [
                (
                    14,
                    TimeSeries(
                        title="Utilization vs band, and busy ratio",
                        description="u: busy fraction x (throughput at the current batch / "
                        "saturation throughput), from the engine's step-time model; the batch "
                        "controller holds it in min_util-max_util (60-80%). Below 50% or above "
                        "90% for 5 minutes raises an alert. Dashed: the duty cycle (NVML "
                        "utilization.gpu on CUDA, engine busy fraction on CPU), ~100% under any "
                        "backlog whatever the batch. Busy high with u low: small batches on a "
                        "device that could do more per step.",
                        dataSource=PROMETHEUS,
                        targets=[
                            prom(UTILIZATION, "u {{device}} {{instance}}", "A"),
                            prom(BUSY, "busy {{device}} {{instance}}", "B"),
                        ],
                        unit="percentunit",
                        valueMin=0,
                        valueMax=1,
                        thresholds=UTILIZATION_STEPS,
                        thresholdsStyleMode="line+area",
                        legendCalcs=["lastNotNull", "mean"],
                        overrides=[BUSY_OVERRIDE],
                    ),
                ),
                (
                    5,
                    Stat(
                        color={"mode": "thresholds"},
                        title="Utilization now",
                        description="u, averaged over devices.",
                        dataSource=PROMETHEUS,
                        targets=[prom(f"avg({UTILIZATION})")],
                        format="percentunit",
                        reduceCalc="lastNotNull",
                        colorMode="background",
                        thresholds=UTILIZATION_STEPS,
                        extraJson={"fieldConfig": {"defaults": {"min": 0, "max": 1}}},
                    ),
                ),
                (
                    5,
                    Stat(
                        color={"mode": "thresholds"},
                        title="Busy ratio now",
                        description="Duty cycle, averaged over devices: a cross-check of u.",
                        dataSource=PROMETHEUS,
                        targets=[prom(f"avg({BUSY})")],
                        format="percentunit",
                        reduceCalc="lastNotNull",
                        colorMode="value",
                        thresholds=BUSY_STEPS,
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
                        "the policy sets. While requests wait at the limit it grows when u is "
                        "below min_util and shrinks above max_util; with nobody waiting it "
                        "holds. A limit at max_num_seqs with u low: the cap (or the KV budget) "
                        "limits the batch, not the policy.",
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
        SPEC_ROW,
    ],
)
