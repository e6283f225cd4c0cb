"""Stats the engine would emit, for storage tests."""

from __future__ import annotations

import time

from runtime.engine.stats import RequestStats, VerificationResult

PER_OP_PROBES = ("geglu", "rms_norm", "rotary", "attention")


def request_stats(i: int, *, reason: str = "stop", now: float | None = None) -> RequestStats:
    now = time.time() if now is None else now
    failed = reason in ("validation", "overloaded", "internal", "timeout")
    return RequestStats(
        request_id=f"req-{i}",
        model="tiny",
        version="stable",
        queued_ts=now - 0.5,
        scheduled_ts=now - 0.4,
        first_token_ts=now - 0.3,
        finished_ts=now,
        prompt_tokens=3 + i % 5,
        cached_tokens=i % 3,
        completion_tokens=1 + i % 7,
        finished_reason=None if failed else reason,
        failure_reason=reason if failed else None,
        batch_size=1 + i % 4,
    )


def probe(i: int, op: str, output: float, expected: float, now: float | None = None):
    return VerificationResult(
        request_id=f"req-{i}",
        model="tiny",
        version="stable",
        op=op,
        output=output,
        expected=expected,
        ts=time.time() if now is None else now,
    )
