"""The status page's stat panels read the embedded evaluator's samples: at 15 s apart the page
read 0 requests for up to 15 s after they were served (issue 39). The default sampling round is
5 s, and the page's window follows it."""

from __future__ import annotations

from alerts.evaluator import EvaluatorConfig
from runtime.config import Settings
from runtime.server.status.page import PageWindow


def test_the_default_sampling_round_is_five_seconds() -> None:
    settings = Settings()
    assert settings.alerts_interval_s == 5.0
    assert EvaluatorConfig.from_settings(settings).interval_s == 5.0


def test_the_page_window_follows_the_round() -> None:
    fast = PageWindow.for_evaluator(interval_s=5.0, time_scale=1.0)
    slow = PageWindow.for_evaluator(interval_s=15.0, time_scale=1.0)
    assert fast.range_s == slow.range_s  # the same hour on screen
    # the rate panels' window shrinks with the round: 35 s instead of 60 s
    assert (fast.rate_interval_s, slow.rate_interval_s) == (35.0, 60.0)
