"""RequestMetrics from a request's record: each phase the difference of two of its timestamps."""

from __future__ import annotations

import pytest

from runtime.engine.stats import RequestStats
from runtime.engine.timings import RequestMetrics


def test_phases_and_rates_from_the_record() -> None:
    stats = RequestStats(
        request_id="r",
        model="m",
        queued_ts=100.0,
        scheduled_ts=100.5,
        first_token_ts=101.5,
        finished_ts=103.5,
        prompt_tokens=12,
        cached_tokens=4,
        completion_tokens=5,
    )
    m = RequestMetrics.of(stats, priority=-2)
    assert (m.queue_seconds, m.prefill_seconds, m.decode_seconds) == (0.5, 1.0, 2.0)
    assert (m.ttft_seconds, m.e2e_seconds) == (1.5, 3.5)
    assert m.mean_itl_seconds == pytest.approx(2.0 / 4)
    assert m.prefill_tokens_per_second == pytest.approx(8 / 1.0)  # cached tokens not computed
    assert m.decode_tokens_per_second == pytest.approx(4 / 2.0)
    assert m.as_dict()["priority"] == -2
    assert m.as_dict()["cached_prompt_tokens"] == 4


def test_a_phase_not_reached_is_none() -> None:
    stats = RequestStats(request_id="r", model="m", queued_ts=1.0, finished_ts=2.0)
    m = RequestMetrics.of(stats)
    assert m.queue_seconds is None and m.ttft_seconds is None and m.decode_seconds is None
    assert m.decode_tokens_per_second is None and m.e2e_seconds == 1.0
