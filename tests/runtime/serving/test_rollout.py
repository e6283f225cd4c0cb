"""Canary routing shares and stickiness (runtime.serving.router) and the automatic rollback decision
(runtime.serving.rollout) on hand-made stats with a fake clock."""

from __future__ import annotations

import random

import pytest

from runtime.engine.stats import RequestStats, VerificationResult
from runtime.errors import ConfigError
from runtime.serving.rollout import (
    WINDOW_BUCKETS,
    RolloutController,
    RolloutEvent,
    RolloutPolicy,
)
from runtime.serving.router import Router

STABLE, CANARY = object(), object()


def _router(weight: float, seed: int = 1234) -> Router:
    router = Router(rng=random.Random(seed))
    router.add("m", stable=STABLE, canary=CANARY, canary_weight=weight)
    return router


def test_weight_0_1_sends_10_percent_of_2000_requests_to_the_canary() -> None:
    router = _router(0.1)
    picks = [router.pick("m").version for _ in range(2000)]
    share = picks.count("canary") / len(picks)
    assert 0.08 <= share <= 0.12, share
    users = [router.pick("m", user=f"user-{i}").version for i in range(2000)]
    user_share = users.count("canary") / len(users)
    assert 0.08 <= user_share <= 0.12, user_share


def test_a_user_sticks_to_a_version_and_raising_the_weight_only_adds_users() -> None:
    router = _router(0.1)
    before = {f"u{i}": router.pick("m", user=f"u{i}").version for i in range(500)}
    for user, version in before.items():  # the same answer every time, RNG or not
        assert all(router.pick("m", user=user).version == version for _ in range(3))
    router.set_canary_weight("m", 0.5)
    after = {user: router.pick("m", user=user).version for user in before}
    assert all(after[u] == "canary" for u, v in before.items() if v == "canary")
    assert sum(v == "canary" for v in after.values()) > sum(v == "canary" for v in before.values())


def test_promote_and_errors() -> None:
    router = _router(0.3)
    retired = router.promote("m")
    assert retired.name == "stable" and retired.engine is STABLE
    route = router.route_of("m")
    assert route.stable.engine is CANARY and route.canary is None and route.canary_weight == 0
    with pytest.raises(ConfigError, match="no canary"):
        router.set_canary_weight("m", 0.5)
    with pytest.raises(ConfigError):
        _router(0.1).set_canary_weight("m", 1.5)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _stats(version: str, *, failed: bool = False, reason: str | None = None) -> RequestStats:
    return RequestStats(
        "r",
        "m",
        version,
        finished_reason=None if failed or reason else "stop",
        failure_reason=reason or ("internal" if failed else None),
    )


@pytest.fixture
def setup() -> tuple[RolloutController, list[RolloutEvent], Clock]:
    events: list[RolloutEvent] = []
    clock = Clock()
    policy = RolloutPolicy(window_s=60, min_requests=20, max_error_rate_delta=0.05)
    controller = RolloutController(_router(0.5), policy, listeners=[events.append], clock=clock)
    return controller, events, clock


def test_canary_error_rate_beyond_the_margin_rolls_back_once(setup) -> None:  # type: ignore[no-untyped-def]
    controller, events, _ = setup
    controller.record(finished=[_stats("stable") for _ in range(40)])
    controller.record(finished=[_stats("canary", failed=i % 2 == 0) for i in range(19)])
    assert events == []  # 19 < min_requests: not judged yet
    controller.record(finished=[_stats("canary", failed=True)])
    assert [(e.action, e.reason, e.automatic) for e in events] == [("rollback", "error_rate", True)]
    assert controller.router.route_of("m").canary_weight == 0.0
    assert events[0].delta == pytest.approx(0.55)
    controller.record(finished=[_stats("canary", failed=True) for _ in range(30)])
    assert len(events) == 1  # the canary takes no traffic any more: nothing to roll back


def test_within_the_margin_or_client_errors_do_not_roll_back(setup) -> None:  # type: ignore[no-untyped-def]
    controller, events, _ = setup
    stable = [_stats("stable", failed=i < 2) for i in range(40)]  # 5 %
    canary = [_stats("canary", failed=i < 2) for i in range(20)]  # 10 %: delta 0.05, not above
    refused = [_stats("canary", reason=r) for r in ("validation", "overloaded") for _ in range(20)]
    controller.record(finished=stable + canary + refused)
    assert events == []
    assert controller.health("m", "canary").num_requests == 20


def test_errors_older_than_the_window_are_forgotten(setup) -> None:  # type: ignore[no-untyped-def]
    controller, events, clock = setup
    controller.record(finished=[_stats("canary", failed=True) for _ in range(10)])
    clock.now += 61
    controller.record(finished=[_stats("canary") for _ in range(20)])
    assert events == [] and controller.health("m", "canary").num_errors == 0


def test_operator_anomalies_on_the_canary_roll_back(setup) -> None:  # type: ignore[no-untyped-def]
    controller, events, _ = setup

    def probe(version: str, error: float) -> VerificationResult:
        return VerificationResult("r", "m", version, "geglu", 1.0 + error, 1.0, 0.0)

    controller.record(verified=[probe("stable", 0.0) for _ in range(10)])
    controller.record(verified=[probe("canary", 0.5) for _ in range(4)])
    assert events == []  # fewer than min_verified probes
    controller.record(verified=[probe("canary", float("nan"))])
    assert [(e.reason, e.automatic) for e in events] == [("anomaly_rate", True)]


def test_operator_actions_emit_events(setup) -> None:  # type: ignore[no-untyped-def]
    controller, events, _ = setup
    controller.set_weight("m", 0.25)
    controller.rollback("m")
    event = controller.promote("m")
    assert [e.action for e in events] == ["set_weight", "rollback", "promote"]
    assert events[1].reason == "operator" and not events[1].automatic
    assert event.retired.engine is STABLE and event.stable == "canary" and event.canary is None


def test_windows_stay_bounded_without_a_canary_to_judge() -> None:
    """Every finished request lands in its version's window; with no canary nothing reads the
    windows, and they once held a pair per request for the life of the server (issue 39)."""
    router = Router(rng=random.Random(0))
    router.add("m", stable=STABLE)  # type: ignore[arg-type]
    clock = Clock()
    controller = RolloutController(router, RolloutPolicy(window_s=60), clock=clock)
    probe = VerificationResult("r", "m", "stable", "geglu", 1.0, 1.0, 0.0)
    for _ in range(2000):  # 20,000 requests and 2,000 probes over 2,000 s
        clock.now += 1.0
        controller.record(finished=[_stats("stable") for _ in range(10)], verified=[probe])
    sizes = controller.window_lengths()
    assert set(sizes) == {"requests m stable", "probes m stable"}
    assert all(0 < n <= WINDOW_BUCKETS + 1 for n in sizes.values()), sizes
    health = controller.health("m", "stable")  # the last 60 s, both ends included
    assert (health.num_requests, health.num_verified) == (610, 61)
