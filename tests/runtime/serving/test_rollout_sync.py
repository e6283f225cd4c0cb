"""Adopting a peer's rollout event (RolloutController.adopt, runtime/serving/rollout_sync.py) on
hand-made events, and replica URLs from a list or DNS (runtime/serving/peers.py)."""

from __future__ import annotations

import random

import pytest

from runtime.errors import ConfigError
from runtime.serving.peers import replica_urls, resolve, split_host_port
from runtime.serving.rollout import RolloutController, RolloutEvent
from runtime.serving.rollout_sync import event_from_status
from runtime.serving.router import Router

STABLE, CANARY = object(), object()
PEER = "http://10.0.0.2:8000"


def _controller(weight: float = 0.5) -> RolloutController:
    router = Router(rng=random.Random(0))
    router.add("m", stable=STABLE, canary=CANARY, canary_weight=weight)
    return RolloutController(router)


def _rollback(ts: float, **fields: object) -> RolloutEvent:
    base: dict[str, object] = dict(
        model="m",
        action="rollback",
        stable="stable",
        canary="canary",
        canary_weight=0.0,
        reason="error_rate",
        automatic=True,
        ts=ts,
        origin=PEER,
    )
    base.update(fields)
    return RolloutEvent(**base)  # type: ignore[arg-type]


def test_a_newer_peer_rollback_is_adopted_once_with_its_time_and_origin() -> None:
    controller = _controller()
    controller.set_weight("m", 0.5)  # own event, now
    own_ts = controller.last_events["m"].ts
    event = _rollback(own_ts + 1)
    adopted = controller.adopt(event)
    assert adopted is not None and adopted.ts == own_ts + 1 and adopted.origin == PEER
    assert controller.router.route_of("m").canary_weight == 0.0
    assert controller.last_events["m"] == adopted
    assert controller.adopt(event) is None  # the same event again: not newer, nothing bounces


def test_older_events_and_other_versions_are_not_adopted() -> None:
    controller = _controller()
    controller.set_weight("m", 0.5)
    own_ts = controller.last_events["m"].ts
    assert controller.adopt(_rollback(own_ts - 1)) is None
    assert controller.adopt(_rollback(own_ts + 1, canary="v2")) is None  # another canary
    assert controller.adopt(_rollback(own_ts + 1, model="other")) is None
    assert controller.router.route_of("m").canary_weight == 0.5


def test_a_replica_without_events_adopts_the_peers_weight() -> None:
    controller = _controller(weight=0.1)  # just started: the weight from its settings
    event = _rollback(1.0, action="set_weight", canary_weight=0.3, automatic=False)
    assert controller.adopt(event) is not None
    assert controller.router.route_of("m").canary_weight == 0.3


def test_a_peer_promotion_is_adopted_when_our_canary_is_its_new_stable() -> None:
    controller = _controller()
    promote = _rollback(1.0, action="promote", stable="canary", canary=None, reason="operator")
    adopted = controller.adopt(promote)
    assert adopted is not None and adopted.retired.engine is STABLE  # the caller drains it
    route = controller.router.route_of("m")
    assert route.stable.engine is CANARY and route.canary is None
    assert controller.adopt(_rollback(2.0)) is None  # no canary any more: nothing to adopt


def test_an_invalid_weight_from_a_peer_is_a_typed_error_and_changes_nothing() -> None:
    controller = _controller()
    with pytest.raises(ConfigError):
        controller.adopt(_rollback(1.0, action="set_weight", canary_weight=1.5))
    assert controller.router.route_of("m").canary_weight == 0.5


def test_event_from_status_reads_what_the_admin_api_sends() -> None:
    last = {
        "action": "rollback",
        "reason": "error_rate",
        "automatic": True,
        "detail": "canary worse",
        "stable": "stable",
        "canary": "canary",
        "canary_weight": 0.0,
        "delta": 0.4,
        "ts": 12.5,
        "origin": "",
    }
    event = event_from_status({"model": "m", "last_event": last}, PEER)
    assert event is not None and event.origin == PEER and event.ts == 12.5
    assert event_from_status({"model": "m", "last_event": None}, PEER) is None
    assert event_from_status({"model": "m", "last_event": {"action": "x"}}, PEER) is None


def test_replica_urls_from_a_list_and_dns() -> None:
    assert split_host_port("runtime:8000") == ("runtime", 8000)
    for bad in ("runtime", "runtime:", ":8000", "runtime:http", "runtime:70000"):
        with pytest.raises(ConfigError):
            split_host_port(bad)
    assert "http://127.0.0.1:8000" in resolve("localhost:8000")
    assert resolve("no-such-host.invalid:8000") == []
    urls = replica_urls(["http://127.0.0.1:8000/", "http://b:1"], "localhost:8000")
    assert urls == ["http://127.0.0.1:8000", "http://b:1"]
