"""Synthetic engine stats with known values (the engine is not needed to prove the sinks)."""

from __future__ import annotations

import random

from runtime.engine.stats import (
    AllocatorStats,
    KVCacheStats,
    RequestEvent,
    RequestStats,
    StepStats,
    TierStats,
    VerificationResult,
)

MODEL = "tiny-llama"
VERSION = "stable"


def finished_request(
    i: int, *, t0: float, prompt_tokens: int, completion_tokens: int, reason: str = "stop"
) -> RequestStats:
    queued = t0 + i * 0.5
    scheduled, first, done = queued + 0.02, queued + 0.05, queued + 0.05 + 0.01 * completion_tokens
    end_event = RequestEvent.CANCELLED if reason == "cancelled" else RequestEvent.FINISHED
    return RequestStats(
        request_id=f"req-{i}",
        model=MODEL,
        version=VERSION,
        queued_ts=queued,
        scheduled_ts=scheduled,
        first_token_ts=first,
        finished_ts=done,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=prompt_tokens // 32 * 16,  # some of the prompt from the prefix cache
        max_tokens=completion_tokens + 4,
        finished_reason=reason,
        batch_size=2,
        events=[
            (RequestEvent.QUEUED, queued),
            (RequestEvent.SCHEDULED, scheduled),
            (RequestEvent.FIRST_TOKEN, first),
            (end_event, done),
        ],
    )


def random_requests(n: int, *, seed: int, t0: float) -> list[RequestStats]:
    rng = random.Random(seed)
    reasons = ("stop", "length", "cancelled")
    return [
        finished_request(
            i,
            t0=t0,
            prompt_tokens=rng.randint(1, 300),
            completion_tokens=rng.randint(2, 64),
            reason=rng.choice(reasons),
        )
        for i in range(n)
    ]


def rejected_request(request_id: str, reason: str = "validation", *, ts: float) -> RequestStats:
    return RequestStats(
        request_id=request_id, model=MODEL, version=VERSION, queued_ts=ts, finished_ts=ts,
        failure_reason=reason,
    )  # fmt: skip


def allocator_stats(scale: int, device: str = "cpu") -> AllocatorStats:
    """Cumulative counters growing with `scale` (hits = 3*scale, misses = scale, ...)."""
    tiers = tuple(
        TierStats(
            tier=name,
            bytes_in_use=1024 * scale * (k + 1),
            bytes_cached=512 * scale,
            hits=3 * scale,
            misses=scale,
            evictions=scale // 2,
            releases=2 * scale,
        )
        for k, name in enumerate(("small", "medium", "large"))
    )
    return AllocatorStats(device=device, tiers=tiers)


def step(
    step_id: int,
    *,
    ts: float,
    request_ids: tuple[str, ...] = (),
    allocator: AllocatorStats | None = None,
    num_seqs: int = 2,
    busy_seconds: float = 0.01,
    kv: KVCacheStats | None = None,
) -> StepStats:
    return StepStats(
        ts=ts,
        step_id=step_id,
        num_seqs=num_seqs,
        num_prefill_tokens=8,
        num_decode_tokens=num_seqs,
        busy_seconds=busy_seconds,
        num_running=num_seqs,
        num_waiting=3,
        batch_size_limit=16,
        request_ids=request_ids,
        started_ts=ts - 0.02,
        allocator=allocator,
        kv=kv if kv is not None else kv_stats(step_id),
        model=MODEL,
        version=VERSION,
    )


def verification(op: str, error: float, *, ts: float) -> VerificationResult:
    return VerificationResult(
        request_id="req-v", model=MODEL, version=VERSION, op=op, output=1.0 + error, expected=1.0,
        ts=ts,
    )  # fmt: skip


def kv_stats(step_id: int) -> KVCacheStats:
    """A page pool of 100 pages after `step_id` steps: 2 prompts of 48 tokens looked up per step,
    16 of them cached, a preemption every 4th step (cumulative counts, as the engine reports)."""
    used = min(10 + step_id, 80)
    return KVCacheStats(
        page_size=16,
        num_pages=100,
        num_used_pages=used,
        num_cached_pages=5,
        num_free_pages=100 - used - 5,
        prefix_query_tokens=96 * (step_id + 1),
        prefix_hit_tokens=16 * (step_id + 1),
        num_preemptions=(step_id + 1) // 4,
    )
