"""The metric contract's lists: every name a scrape shows (what tests, dashboards and alert rules
check against) and the label values pre-initialised so a scrape shows them at zero before any
traffic. The metric objects themselves (name, type, label set) are in monitoring.metrics.
"""

from __future__ import annotations

from runtime.engine.stats import FailureReason, FinishReason

# Every name of the contract table that every scrape shows (counters with their `_total`). The
# table's `fastllm_device_tensor_active_ratio` is absent where NVML GPM is (CPU, pre-Hopper), so
# it is in OPTIONAL_METRIC_NAMES: dashboards may not rely on it.
CONTRACT_METRIC_NAMES: tuple[str, ...] = (
    "fastllm_memory_usage",
    "fastllm_memory_total",
    "fastllm_device_utilization_ratio",
    "fastllm_device_busy_ratio",
    "fastllm_batch_size",
    "fastllm_batch_size_limit",
    "fastllm_num_requests_running",
    "fastllm_num_requests_waiting",
    "fastllm_time_to_first_token_seconds",
    "fastllm_time_per_output_token_seconds",
    "fastllm_e2e_request_latency_seconds",
    "fastllm_request_queue_seconds",
    "fastllm_prompt_tokens_total",
    "fastllm_generation_tokens_total",
    "fastllm_request_success_total",
    "fastllm_request_failure_total",
    "fastllm_allocator_bytes",
    "fastllm_allocator_events_total",
    "fastllm_operator_anomalies_total",
    "fastllm_scheduler_steals_total",
    "fastllm_inference_log_dropped_total",
    "fastllm_inference_log_queue_rows",
    "fastllm_kv_cache_usage_ratio",
    "fastllm_kv_cache_pages",
    "fastllm_prefix_cache_queries_total",
    "fastllm_prefix_cache_hits_total",
    "fastllm_num_preemptions_total",
    # structured output (monitoring.structured_metrics)
    "fastllm_constrained_requests_total",
    "fastllm_grammar_compile_seconds",
    "fastllm_grammar_cache_hits_total",
    "fastllm_grammar_cache_misses_total",
    "fastllm_grammar_incomplete_total",
    "fastllm_grammar_cache_events_total",
    # the compiled decode step (runtime.models.fast): 1 once it fell back to the eager forward
    "fastllm_compile_fallbacks",
    # per request priority (monitoring.priority_metrics)
    "fastllm_priority_requests_total",
    "fastllm_priority_request_queue_seconds",
    "fastllm_priority_time_to_first_token_seconds",
    # speculative decoding (monitoring.spec_metrics)
    "fastllm_spec_decode_num_draft_tokens_total",
    "fastllm_spec_decode_num_accepted_tokens_total",
    "fastllm_spec_decode_num_emitted_tokens_total",
    "fastllm_spec_decode_acceptance_ratio",
)

OPTIONAL_METRIC_NAMES: tuple[str, ...] = (
    "fastllm_device_tensor_active_ratio",
    # the idle self-check (monitoring.self_check): absent until an engine has been idle
    "fastllm_kv_leaked_pages",
    "fastllm_allocator_orphan_blocks",
    # tensor parallelism (monitoring.tp_metrics): registered only when tensor_parallel_size > 1
    "fastllm_tp_worker_restarts_total",
)

# Label values pre-initialised so that a scrape shows them at zero before any traffic.
FINISHED_REASONS: tuple[str, ...] = tuple(r.value for r in FinishReason)
# includes "unauthorized": refused before authentication (counted, never an inference_log row)
FAILURE_REASONS: tuple[str, ...] = tuple(r.value for r in FailureReason)
# why the inference_log writer could not store a row (storage.writer.DROP_REASONS)
LOG_DROP_REASONS: tuple[str, ...] = ("queue_full", "unstorable", "shutdown")
ALLOCATOR_TIERS: tuple[str, ...] = ("small", "medium", "large")
ALLOCATOR_STATES: tuple[str, ...] = ("in_use", "cached")
ALLOCATOR_EVENTS: tuple[str, ...] = ("hit", "miss", "evict", "release")
VERIFIED_OPS: tuple[str, ...] = ("logit", "geglu", "swiglu", "rms_norm", "rotary", "attention")
KV_PAGE_STATES: tuple[str, ...] = ("used", "cached", "free")
# `endpoint` label of the request metrics (counters, latency histograms): the API a request came
# through, from its gen_ai.operation.name; an operation outside the table counts as "other"
ENDPOINT_OF_OPERATION: dict[str, str] = {
    "text_completion": "completions",
    "chat": "chat",
    "responses": "responses",
    "messages": "messages",
    "embeddings": "embeddings",
}
ENDPOINTS: tuple[str, ...] = (*ENDPOINT_OF_OPERATION.values(), "other")


def endpoint_of(operation: str) -> str:
    return ENDPOINT_OF_OPERATION.get(operation, "other")
