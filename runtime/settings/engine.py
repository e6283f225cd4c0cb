"""Settings of the engine: batch bounds and the KV pool, the allocator, the adaptive batch
policy (and `batch_goal`), grammar compiles, priority scheduling, the fair share of the batch."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

# `batch_goal`: the latency/throughput trade-off as one word, mapped to the controller's band.
# u is the share of the device's saturation throughput delivered
# (runtime.engine.batching.throughput), so the band says how close to saturation the engine runs
# (docs/batching.md): latency (0.5-0.7) short steps, about 60% of saturation throughput;
# balanced (0.6-0.8, the default band) the knee of the throughput curve; throughput (0.9-1.0) the
# limit grows until the engine delivers 90% or more of saturation, and never shrinks for being
# near it (nothing reads above 1). Kept here, outside the engine package: the alerts' evaluator
# imports the settings and may not import the engine.
BatchGoal = Literal["latency", "balanced", "throughput"]

BATCH_GOALS: dict[str, tuple[float, float]] = {  # goal -> (min_util, max_util)
    "latency": (0.5, 0.7),
    "balanced": (0.6, 0.8),
    "throughput": (0.9, 1.0),
}


def band_for(goal: str) -> tuple[float, float]:
    """(min_util, max_util) of a goal; KeyError for an unknown one (callers validate first)."""
    return BATCH_GOALS[goal]


class EngineSettings(BaseModel):
    # --- engine ------------------------------------------------------------------------------
    max_num_seqs: int = Field(64, ge=1, description="upper bound of the batch (sequences)")
    min_num_seqs: int = Field(1, ge=1)
    initial_num_seqs: int = Field(16, ge=1)
    max_num_batched_tokens: int = Field(2048, ge=16, description="per-step token budget")
    max_queued_requests: int = Field(256, ge=1)
    max_queued_tokens: int = Field(262144, ge=1)
    request_timeout_s: float = Field(120.0, gt=0)
    kv_cache_bytes: int = Field(
        1 << 30, ge=1 << 20, description="the KV page pool, reserved when the model loads"
    )
    kv_block_size: int = Field(16, ge=1, le=1024, description="tokens per KV page")
    enable_prefix_caching: bool = Field(True, description="reuse KV pages of shared prefixes")
    num_replicas: int = Field(1, ge=1, description="engine replicas (work-stealing pool)")
    # what is built around the forward (runtime.models.fast.build): at load, never on a request
    compile: str = Field(
        "auto",
        pattern="^(auto|on|off)$",
        description="auto | on (layers torch.compiled, paid at load) | off (nothing built)",
    )
    cuda_graphs: str = Field(
        "auto", pattern="^(auto|on|off)$", description="capture the decode step per batch bucket"
    )
    # quantized CPU layers (runtime.models.dense_batch): a dense bf16 copy of each projection,
    # run for steps of many rows (batched decode, prefill), where torch's int4/int8 kernels are
    # slower than a bf16 GEMM; the crossover is measured at load unless dense_batch_min_rows
    dense_batch_weights: str = Field(
        "auto",
        pattern="^(auto|on|off)$",
        description="auto (on CPU, when the copies fit dense_batch_max_bytes and are faster) "
        "| on | off",
    )
    dense_batch_max_bytes: int = Field(
        1 << 30, ge=0, description="auto attaches the dense copies only up to this many bytes"
    )
    dense_batch_min_rows: int = Field(
        0, ge=0, description="rows from which a step runs the dense copies; 0: measured at load"
    )

    # --- allocator (runtime.memory.AllocatorConfig.from_settings) ----------------------------
    allocator_small_max_bytes: int = Field(1 << 20, ge=16, description="small tier: below this")
    allocator_medium_max_bytes: int = Field(10 << 20, ge=16, description="large tier: above this")
    allocator_small_blocks_per_class: int = Field(32, ge=0, description="preallocated per class")
    allocator_medium_cache_bytes: int = Field(256 << 20, ge=0, description="medium LRU cache cap")
    heap_trim_interval_s: float = Field(
        5.0, ge=0.0, description="return free heap pages to the OS this often (0: never)"
    )
    heap_mmap_threshold_bytes: int = Field(
        0,
        ge=0,
        le=32 << 20,  # glibc's limit (memory.host_heap.MMAP_THRESHOLD_MAX); config stays leaf
        description="fix glibc's mmap threshold (flatter RSS, slower); 0: glibc's dynamic one",
    )
    malloc: str = Field(
        "auto",
        pattern="^(auto|jemalloc|glibc)$",
        description="the C allocator `serve` runs on: auto (jemalloc when libjemalloc2 is "
        "installed, preloaded by a re-exec at start), jemalloc (required), glibc",
    )

    # --- adaptive batch policy -----------------------------------------------------------------
    # utilization = share of the device's saturation throughput delivered (docs/batching.md)
    min_util: float = Field(
        0.6, ge=0.0, le=1.0, description="below this utilization the batch limit grows 20%"
    )
    max_util: float = Field(
        0.8,
        ge=0.0,
        le=1.0,
        description="above this utilization the batch limit shrinks 10%; lower it to favour "
        "latency. Raising it alone only stops shrinking: a reading inside the band holds, so to "
        "favour throughput raise min_util too, or use batch_goal throughput (band 0.9-1.0)",
    )
    batch_goal: BatchGoal | None = Field(
        None,
        description="the trade-off as one word, replacing min_util/max_util: latency (0.5-0.7), "
        "balanced (0.6-0.8) or throughput (0.9-1.0: within 10% of the best batch's throughput)",
    )
    step_up: float = Field(0.2, gt=0.0, le=1.0)
    step_down: float = Field(0.1, gt=0.0, le=1.0)
    control_interval_s: float = Field(1.0, gt=0.0)
    max_queue_wait_s: float = Field(
        1.0,
        ge=0.0,
        description="with the batch limit binding, a request waiting longer than this for a place "
        "grows the limit whatever the band says (a first token before short steps); 0: off",
    )
    batch_warmup: bool = Field(
        True, description="at load, run a few batch sizes to seed the step-time model"
    )

    # --- structured output: grammar compiles (runtime.engine.constraints.limits) ---------------
    # a compile runs in a worker process, killed past its time or memory budget (its request gets
    # a 400); each tenant (API key, or client address without keys) runs at most
    # grammar_compile_workers_per_tenant compiles at once, so no client holds every worker
    grammar_compile_timeout_s: float = Field(10.0, gt=0.0, le=3600.0)
    grammar_compile_max_memory_bytes: int = Field(1 << 30, ge=64 << 20)
    grammar_compile_workers: int = Field(2, ge=1, le=64)
    grammar_compile_workers_per_tenant: int = Field(1, ge=1, le=64)
    grammar_cache_max_bytes: int = Field(
        64 << 20, ge=0, description="compiled grammars kept, by their measured heap bytes"
    )
    grammar_warm: bool = Field(
        True,
        description="serve starts the compile workers once the model has loaded, so the first "
        "constrained request does not wait ~2 s for their boot; false: they start at the first "
        "constrained request (a server that never constrains spends neither their CPU nor the "
        "memory of their forkserver)",
    )
    # a constraint past these is a 400 naming its field, before any parse or compile
    grammar_max_regex_chars: int = Field(4096, ge=1)
    grammar_max_schema_bytes: int = Field(64 << 10, ge=2)
    grammar_max_schema_properties: int = Field(1024, ge=1)
    grammar_max_schema_depth: int = Field(32, ge=1, le=1000)
    grammar_max_rules: int = Field(1024, ge=1)
    grammar_max_grammar_bytes: int = Field(64 << 10, ge=1)

    # --- per-request timings and priority scheduling (issue 38) ---------------------------------
    enable_request_metrics: bool = Field(
        False,
        description="add a `metrics` object (queue, prefill, decode seconds, TTFT, mean "
        "inter-token latency, tokens/s, cached prompt tokens) to every response body and final "
        "stream event of /v1/completions, /v1/chat/completions, /v1/responses, /v1/messages",
    )
    scheduling_policy: str = Field(
        "fcfs",
        pattern="^(fcfs|priority)$",
        description="fcfs: first come first served; priority: a request's `priority` (lower runs "
        "first, FIFO within one) orders the waiting queue and picks who is preempted",
    )
    priority_aging_s: float = Field(
        10.0,
        ge=0.0,
        description="priority policy: a waiting request gains one priority level per this many "
        "seconds, so none starves; 0: no aging",
    )
    api_key_priorities: list[int] = Field(
        default_factory=list,
        description="default `priority` per API key, in api_keys' order (missing: 0)",
    )

    # --- fair share of the batch (runtime.engine.fair_share) ---------------------------------
    # while its sequences run, one API request (a batch's prompts and choices) / one tenant holds
    # at most this fraction of the batch's sequence cap, so the next request finds a slot; the
    # waiting queue admits the least-served tenant and request first
    max_request_batch_share: float = Field(0.9, gt=0.0, le=1.0)
    max_tenant_batch_share: float = Field(1.0, gt=0.0, le=1.0)

    @field_validator("api_key_priorities", mode="before")
    @classmethod
    def _split_priorities(cls, value: Any) -> Any:
        if isinstance(value, str):  # "2,-1" or "[2, -1]" (a flag, the environment)
            return [k.strip() for k in value.strip().strip("[]").split(",") if k.strip()]
        return value
