"""The overview's LoRA row (issue 40): adapters resident and loading, loads and evictions per
second, requests per adapter and each resident adapter's bytes (monitoring.lora_metrics). The
totals read 0, not "No data", on a model serving no adapter; the per-adapter series exist once
an adapter is resident or has served a request."""

from grafanalib.core import TimeSeries

from dashboards.common import MODEL_SEL, PROMETHEUS, RATE, or_zero, prom


def _adapters(state: str) -> str:
    return or_zero(f'sum(fastllm_lora_adapters{{{MODEL_SEL}, state="{state}"}})')


def _rate(name: str) -> str:
    return or_zero(f"sum(rate({name}{{{MODEL_SEL}}}[{RATE}]))")


_REQUESTS = f"sum by (adapter) (rate(fastllm_lora_requests_total{{{MODEL_SEL}}}[{RATE}]))"
_BYTES = f"sum by (adapter) (fastllm_lora_adapter_bytes{{{MODEL_SEL}}})"

LORA_ROW = (
    8,
    [
        (
            6,
            TimeSeries(
                title="LoRA adapters resident / loading",
                description="Resident: adapters whose weights hold an allocator block (at most "
                "max_loras). Loading: adapters being read from their directory (a load, or a "
                "reload after an eviction: that request waits for it).",
                dataSource=PROMETHEUS,
                targets=[
                    prom(_adapters("resident"), "resident", "A"),
                    prom(_adapters("loading"), "loading", "B"),
                ],
                unit="short",
            ),
        ),
        (
            6,
            TimeSeries(
                title="LoRA loads and evictions/s",
                description="Loads: adapters made resident (first loads and reloads). "
                "Evictions: the least recently used idle adapter dropped for another beyond "
                "max_loras. Evictions that keep pace with loads: the working set exceeds "
                "max_loras and requests wait for reads.",
                dataSource=PROMETHEUS,
                targets=[
                    prom(_rate("fastllm_lora_loads_total"), "loads", "A"),
                    prom(_rate("fastllm_lora_evictions_total"), "evictions", "B"),
                ],
                unit="ops",
            ),
        ),
        (
            6,
            TimeSeries(
                title="Requests per LoRA adapter",
                description="Finished requests per second by the adapter they selected with "
                "`model`; requests to the base model are not counted here.",
                dataSource=PROMETHEUS,
                targets=[
                    prom(_REQUESTS, "{{adapter}}", "A"),
                    prom(_rate("fastllm_lora_requests_total"), "all adapters", "B"),
                ],
                unit="reqps",
            ),
        ),
        (
            6,
            TimeSeries(
                title="LoRA adapter memory",
                description="Allocator bytes of each resident adapter (owner lora:<name>; "
                "/admin/memory lists them). Unloading or evicting returns them.",
                dataSource=PROMETHEUS,
                targets=[
                    prom(_BYTES, "{{adapter}}", "A"),
                    prom(
                        or_zero(f"sum(fastllm_lora_adapter_bytes{{{MODEL_SEL}}})"),
                        "all adapters",
                        "B",
                    ),
                ],
                unit="bytes",
            ),
        ),
    ],
)
