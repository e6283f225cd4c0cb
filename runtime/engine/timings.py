"""One request's timings as its response reports them (`enable_request_metrics`): derived once,
when the request closes, from the same `RequestStats` timestamps the histograms, spans and
`inference_log` rows read, so a body's numbers and a scrape's agree. No clock is read here.

    queued ──queue── scheduled ──prefill── first token ──decode── finished
    └──────────────ttft───────────────────┘
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from runtime.engine.stats import RequestStats

__all__ = ["RequestMetrics"]


def _span(start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, end - start)


def _rate(count: int, seconds: float | None) -> float | None:
    if seconds is None or seconds <= 0.0 or count <= 0:
        return None
    return count / seconds


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """Seconds and rates of one request; None where a phase was not reached (e.g. a request that
    ended before its first token has no decode)."""

    queue_seconds: float | None  # admission (validation) to first schedule
    prefill_seconds: float | None  # first schedule to first token (preemptions included)
    decode_seconds: float | None  # first token to the end
    ttft_seconds: float | None  # admission to first token (queue + prefill)
    e2e_seconds: float | None  # admission to the end
    mean_itl_seconds: float | None  # mean inter-token latency after the first token (TPOT)
    prefill_tokens_per_second: float | None  # prompt tokens computed (cached ones excluded)
    decode_tokens_per_second: float | None  # tokens after the first, per decode second
    prompt_tokens: int
    cached_prompt_tokens: int  # prompt tokens whose KV came from the prefix cache
    completion_tokens: int  # every choice's
    priority: int = 0  # the request's priority (runtime.engine.priority)

    @classmethod
    def of(cls, stats: RequestStats, priority: int = 0) -> RequestMetrics:
        prefill = _span(stats.scheduled_ts, stats.first_token_ts)
        decode = _span(stats.first_token_ts, stats.finished_ts)
        steps = stats.longest_choice_tokens or stats.completion_tokens
        return cls(
            queue_seconds=stats.queue_seconds,
            prefill_seconds=prefill,
            decode_seconds=decode,
            ttft_seconds=stats.ttft_seconds,
            e2e_seconds=stats.e2e_seconds,
            mean_itl_seconds=stats.tpot_seconds,
            prefill_tokens_per_second=_rate(stats.prompt_tokens - stats.cached_tokens, prefill),
            decode_tokens_per_second=_rate(steps - 1, decode),
            prompt_tokens=stats.prompt_tokens,
            cached_prompt_tokens=stats.cached_tokens,
            completion_tokens=stats.completion_tokens,
            priority=priority,
        )

    def as_dict(self) -> dict[str, Any]:
        """The `metrics` object of a response body (JSON-ready)."""
        return asdict(self)
