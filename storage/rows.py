"""Engine numbers → `inference_log` rows (plain dicts, one key per column, ready for a Core
executemany). Computed in `record()` so the row is a snapshot of the stats at that moment.

Row policy: exactly one row per request, its status the finished reason (stop/length/cancelled) or
the failure reason (validation/overloaded/internal/timeout). A verified request's row carries
op="logit" with output/expected; every other probe (geglu, swiglu, rms_norm, rotary, attention) is
an extra row with status="probe" and the same request_id.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from typing import Any

from runtime.engine.stats import RequestStats, VerificationResult

Row = dict[str, Any]
# columns a row written before they existed (a spooled row of an older release) lacks
LATER_COLUMNS = (
    "tolerance",
    "instance",
    "adapter",
    "spec_draft_tokens",
    "spec_accepted_tokens",
)

LOGIT_OP = "logit"  # the probe that lives on the request's own row
PROBE_STATUS = "probe"


def server_instance(settings: Any) -> str:
    """A server's `instance`: host:port, as the embedded alert evaluator labels its samples."""
    return f"{settings.host}:{settings.port}"


def utc(ts: float | None) -> datetime:
    """Wall-clock seconds → aware UTC datetime (now when the timestamp is missing)."""
    return datetime.fromtimestamp(time.time() if ts is None else ts, tz=timezone.utc)


def request_row(stats: RequestStats, instance: str | None = None) -> Row:
    return {
        "ts": utc(stats.finished_ts),
        "request_id": stats.request_id,
        "model": stats.model,
        "version": stats.version,
        "status": stats.status,
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
        "completion_tokens": stats.completion_tokens,
        "n": stats.n,
        "logprobs": stats.logprobs,
        "constraint": stats.constraint,
        "latency_s": stats.e2e_seconds,
        "ttft_s": stats.ttft_seconds,
        "batch_size": stats.batch_size,
        "op": None,
        "output": None,
        "expected": None,
        "tolerance": None,
        "instance": instance,
        "adapter": stats.adapter,
        "spec_draft_tokens": stats.spec_draft_tokens or None,
        "spec_accepted_tokens": stats.spec_accepted_tokens if stats.spec_draft_tokens else None,
    }


def probe_row(result: VerificationResult, instance: str | None = None) -> Row:
    return {
        "ts": utc(result.ts),
        "request_id": result.request_id,
        "model": result.model,
        "version": result.version,
        "status": PROBE_STATUS,
        "prompt_tokens": None,
        "cached_tokens": None,
        "completion_tokens": None,
        "n": None,
        "logprobs": None,
        "constraint": None,
        "latency_s": None,
        "ttft_s": None,
        "batch_size": None,
        "op": result.op,
        "output": _storable(result.output, nan_as=math.inf),
        "expected": _storable(result.expected, nan_as=-math.inf),
        "tolerance": result.tolerance,
        "instance": instance,
        "adapter": None,
        "spec_draft_tokens": None,
        "spec_accepted_tokens": None,
    }


def _storable(value: float, *, nan_as: float) -> float:
    """SQLite stores NaN as NULL, which the audit query would silently skip. A NaN output is
    stored as +inf and a NaN expected value as -inf, so ABS(output - expected) is +inf (always
    an anomaly) on both databases, even when both sides are NaN."""
    value = float(value)
    return nan_as if math.isnan(value) else value


def merge_logit(row: Row, logit: Row) -> None:
    """Put a logit probe onto its request's row (in place)."""
    row["op"] = logit["op"]
    row["output"] = logit["output"]
    row["expected"] = logit["expected"]
    row["tolerance"] = logit.get("tolerance")
