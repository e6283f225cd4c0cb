"""Memory: how full each memory type is, who holds allocator bytes, and whether usage only grows."""

from grafanalib.core import TimeSeries

from dashboards.common import (
    INSTANCE_SEL,
    MODEL_SEL,
    PROMETHEUS,
    RATE,
    bar_gauge,
    make_dashboard,
    prom,
)

USAGE = f"fastllm_memory_usage{{{INSTANCE_SEL}}}"
TOTAL = f"fastllm_memory_total{{{INSTANCE_SEL}}}"
# The operations guide's ratio, per type (gpu, cpu = process RSS, allocator = KV budget).
RATIO = f"{USAGE} / {TOTAL}"
GROWTH_STEPS = [{"color": "green", "value": None}, {"color": "orange", "value": 1}]


def events(event: str) -> str:
    return f'fastllm_allocator_events_total{{{INSTANCE_SEL}, event=~"{event}"}}'


KV_USAGE = f"fastllm_kv_cache_usage_ratio{{{MODEL_SEL}}}"
KV_PAGES = f"sum by (state) (fastllm_kv_cache_pages{{{MODEL_SEL}}})"
PREFIX_HIT_RATE = (
    f"sum by (model, version) (rate(fastllm_prefix_cache_hits_total{{{MODEL_SEL}}}[{RATE}])) / "
    f"sum by (model, version) (rate(fastllm_prefix_cache_queries_total{{{MODEL_SEL}}}[{RATE}]))"
)
PREEMPTIONS = (
    f"sum by (model, version) (rate(fastllm_num_preemptions_total{{{MODEL_SEL}}}[{RATE}]))"
)

UTILIZATION_STEPS = [
    {"color": "green", "value": None},
    {"color": "orange", "value": 0.8},
    {"color": "red", "value": 0.9},
]


def series(title: str, description: str, targets: list, unit: str, **kwargs) -> TimeSeries:
    return TimeSeries(
        title=title,
        description=description,
        dataSource=PROMETHEUS,
        targets=targets,
        unit=unit,
        legendDisplayMode="table",
        legendPlacement="right",
        legendCalcs=["lastNotNull", "max"],
        **kwargs,
    )


dashboard = make_dashboard(
    uid="fastllm-memory",
    title="fastllm / Memory",
    description="fastllm_memory_usage / fastllm_memory_total per type, allocator tiers, growth, "
    "KV cache pages, prefix-cache hits and preemptions.",
    rows=[
        (
            6,
            [
                (
                    8,
                    bar_gauge(
                        "Memory used / total",
                        "The operations guide's query per type. A bar near the right end means "
                        "the next large request may not fit.",
                        [prom(RATIO, "{{type}} {{instance}}", instant=True)],
                        unit="percentunit",
                        steps=UTILIZATION_STEPS,
                        max_value=1,
                    ),
                ),
                (
                    16,
                    series(
                        "Memory used / total over time",
                        "Batching makes this a sawtooth; a rising floor is a leak.",
                        [prom(RATIO, "{{type}} {{instance}}")],
                        "percentunit",
                        thresholds=UTILIZATION_STEPS,
                        thresholdsStyleMode="dashed",
                    ),
                ),
            ],
        ),
        (
            8,
            [
                (
                    12,
                    series(
                        "Memory bytes (used and total)",
                        "Absolute bytes per type: used (solid) against what that type has.",
                        [
                            prom(USAGE, "used {{type}} {{instance}}", "A"),
                            prom(TOTAL, "total {{type}} {{instance}}", "B"),
                        ],
                        "bytes",
                    ),
                ),
                (
                    12,
                    series(
                        "Allocator bytes by tier and state",
                        "in_use = handed out (owner-tagged blocks); cached = freed blocks kept "
                        "for reuse (small free lists, medium LRU). Large is never cached.",
                        [
                            prom(
                                f"sum by (tier, state) (fastllm_allocator_bytes{{{INSTANCE_SEL}}})",
                                "{{tier}} {{state}}",
                            )
                        ],
                        "bytes",
                        stacking={"mode": "normal", "group": "A"},
                        fillOpacity=25,
                    ),
                ),
            ],
        ),
        (
            8,
            [
                (
                    12,
                    series(
                        "Allocator hit / miss / evict rate",
                        "Per tier. Misses go to the device allocator; evictions mean the medium "
                        "cache cap is too small for the working set.",
                        [
                            prom(
                                f"sum by (tier, event) (rate({events('hit|miss|evict')}[{RATE}]))",
                                "{{tier}} {{event}}",
                            )
                        ],
                        "ops",
                    ),
                ),
                (
                    12,
                    series(
                        "Allocator hit ratio (since start)",
                        "hits / (hits + misses) per tier since the process started; the small "
                        "tier should stay near 1. Counted since start, not per interval: the KV "
                        "page pool is one block taken at start, so under steady serving the "
                        "tiers may see no allocation for a long time.",
                        [
                            prom(
                                f"sum by (tier) ({events('hit')}) / "
                                f"sum by (tier) ({events('hit|miss')})",
                                "{{tier}}",
                            )
                        ],
                        "percentunit",
                    ),
                ),
            ],
        ),
        (
            7,
            [
                (
                    8,
                    bar_gauge(
                        "Growth over 1h",
                        "Change of used bytes per type over the last hour.",
                        [prom(f"delta({USAGE}[1h])", "{{type}} {{instance}}", instant=True)],
                        unit="bytes",
                        steps=GROWTH_STEPS,
                        min_value=None,
                    ),
                ),
                (
                    8,
                    bar_gauge(
                        "Growth over 24h",
                        "Change of used bytes per type over the last day. Positive every day at "
                        "similar load = a leak (see the FastllmMemoryGrowth alert).",
                        [prom(f"delta({USAGE}[24h])", "{{type}} {{instance}}", instant=True)],
                        unit="bytes",
                        steps=GROWTH_STEPS,
                        min_value=None,
                    ),
                ),
                (
                    8,
                    series(
                        "Projected use in 24h / total",
                        "The 30-minute linear trend extended by a day, over the type's total; "
                        "above 1 is what FastllmMemoryGrowth alerts on (with a rising floor).",
                        [
                            prom(
                                f"predict_linear({USAGE}[30m], 24 * 3600) / {TOTAL}",
                                "{{type}} {{instance}}",
                            )
                        ],
                        "percentunit",
                    ),
                ),
            ],
        ),
        (
            8,
            [
                (
                    6,
                    series(
                        "KV cache pages in use",
                        "Pages held by running sequences / pages in the pool. Near 1 with "
                        "requests waiting: the pool (kv_cache_bytes) binds the batch, and "
                        "preemptions follow.",
                        [prom(KV_USAGE, "{{model}} {{version}} {{instance}}")],
                        "percentunit",
                        thresholds=UTILIZATION_STEPS,
                        thresholdsStyleMode="dashed",
                    ),
                ),
                (
                    6,
                    series(
                        "KV pages by state",
                        "used = held by sequences; cached = held by none, kept for prefix reuse "
                        "(evicted oldest first when no page is free); free.",
                        [prom(KV_PAGES, "{{state}}")],
                        "short",
                        stacking={"mode": "normal", "group": "A"},
                        fillOpacity=25,
                    ),
                ),
                (
                    6,
                    series(
                        "Prefix cache hit rate",
                        "Prompt tokens whose KV came from the cache / prompt tokens looked up. "
                        "High with shared system prompts; TTFT drops with it.",
                        [prom(PREFIX_HIT_RATE, "{{model}} {{version}}")],
                        "percentunit",
                    ),
                ),
                (
                    6,
                    series(
                        "Preemptions",
                        "Sequences preempted per second for lack of KV pages (recomputed "
                        "later: same output, wasted compute). Sustained = FastllmKVPreemptions.",
                        [prom(PREEMPTIONS, "{{model}} {{version}}")],
                        "ops",
                    ),
                ),
            ],
        ),
    ],
)
