"""Rollout across two live replicas, each with its own controller and the other as its peer
(runtime/serving/rollout_sync.py): `fastllm rollout` fans out to both and reports each; a faulty
canary rolled back automatically on one replica (the only one that got traffic) shows in the
other's status, marked as adopted; an operator action on one reaches the other; a periodic sync
round adopts a peer's event with no nudge at all.

Both replicas' periodic rounds are an hour apart here, so what reaches the other replica in the
first two tests came through the nudge a deciding replica sends its peers."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.models import ops
from runtime.serving.rollout import RolloutController
from runtime.serving.rollout_sync import RolloutSync
from runtime.serving.router import Router
from tests.runtime.server.live import (
    ADMIN_TOKEN,
    LiveServer,
    bound_socket,
    light_settings,
    live_server,
    url_of,
)
from tests.runtime.server.test_rollout import MODEL, _canary_router, _complete, _rollout, _total

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
NEVER_S = 3600.0  # periodic rounds: not within a test


@pytest.fixture(scope="module")
def pair(demo_model_dir: Callable[[str], Path]) -> Iterator[tuple[LiveServer, LiveServer]]:
    def broken_geglu(gate: Any, up: Any) -> Any:  # only the gemma canary runs geglu
        raise RuntimeError("injected fault in geglu")

    socks = [bound_socket(), bound_socket()]
    urls = [url_of(s) for s in socks]
    make = _canary_router(demo_model_dir("llama"), demo_model_dir("gemma"), weight=0.0)
    with pytest.MonkeyPatch.context() as patch, ExitStack() as stack:
        patch.setattr(ops, "geglu", broken_geglu)
        servers = []
        for sock, peer in ((socks[0], urls[1]), (socks[1], urls[0])):
            settings = light_settings(
                rollout_min_requests=10, rollout_peers=[peer], rollout_sync_interval_s=NEVER_S
            )
            servers.append(stack.enter_context(live_server(settings, make, sock=sock)))
        yield servers[0], servers[1]


def _status(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/admin/rollout", headers=ADMIN, timeout=10).json())


def _wait_status(url: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while not done(status := _status(url)):
        assert time.monotonic() < deadline, f"{url} never got there: {status}"
        time.sleep(0.05)
    return status


def _metric(url: str, name: str, **labels: str) -> float:
    from tests.runtime.server.test_rollout import _samples

    return _total(_samples(url), name, **labels)


def test_automatic_rollback_on_one_replica_shows_in_the_others_status(
    pair: tuple[LiveServer, LiveServer], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = pair
    cli = ["--url", a.url, "--url", b.url, "--admin-token", ADMIN_TOKEN]
    assert _rollout(["set", "--weight", "0.5", *cli], capsys) == 0
    out = capsys.readouterr().out
    assert f"== {a.url}" in out and f"== {b.url}" in out
    assert "all 2 replicas agree: stable stable, canary canary (weight 0.5)" in out

    for i in range(200):  # traffic to `a` only: `b` never judges its own canary
        _complete(a.url, f"user-{i}")
        if _status(a.url)["canary_weight"] == 0.0:
            break
    mine = _status(a.url)["last_event"]
    assert mine["automatic"] and mine["reason"] == "error_rate" and mine["origin"] == ""
    theirs = _wait_status(b.url, lambda s: s["canary_weight"] == 0.0)["last_event"]
    assert theirs["action"] == "rollback" and theirs["automatic"]
    assert theirs["reason"] == "error_rate" and theirs["origin"] == a.url
    assert theirs["ts"] == mine["ts"]  # the decision's time, not the adoption's
    assert _status(b.url)["versions"][1]["num_requests"] == 0  # b saw no canary traffic

    assert _rollout(["status", *cli], capsys) == 0
    out = capsys.readouterr().out
    assert "all 2 replicas agree: stable stable, canary canary (weight 0)" in out
    assert f"last: rollback (automatic, error_rate) [from {a.url}]" in out
    # the decision is counted once, where it was made; the other counts the action it took
    rollbacks = "fastllm_rollout_rollbacks_total"
    assert _metric(a.url, rollbacks, reason="error_rate") == 1
    assert _metric(b.url, rollbacks, reason="error_rate") == 0
    assert _metric(b.url, "fastllm_rollout_events_total", action="rollback") == 1
    assert _metric(b.url, "fastllm_rollout_canary_weight", model=MODEL) == 0


def test_an_operator_action_on_one_replica_reaches_the_other(
    pair: tuple[LiveServer, LiveServer], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = pair
    token = ["--admin-token", ADMIN_TOKEN]
    assert _rollout(["set", "--weight", "0.25", "--url", b.url, *token], capsys) == 0
    adopted = _wait_status(a.url, lambda s: s["canary_weight"] == 0.25)["last_event"]
    assert adopted["action"] == "set_weight" and adopted["origin"] == b.url
    capsys.readouterr()
    assert _rollout(["status", "--url", a.url, "--url", b.url, *token], capsys) == 0
    assert "all 2 replicas agree" in capsys.readouterr().out


def test_a_periodic_round_adopts_a_peer_event_without_a_nudge(
    pair: tuple[LiveServer, LiveServer],
) -> None:
    a, _ = pair
    newest = _status(a.url)["last_event"]
    if newest is None:  # run on its own: an event for the periodic round to find
        body = {"action": "set", "weight": 0.5}
        reply = httpx.post(f"{a.url}/admin/rollout", json=body, headers=ADMIN, timeout=10)
        assert reply.status_code == 200, reply.text
        newest = _status(a.url)["last_event"]
    router = Router(rng=random.Random(0))
    router.add(MODEL, stable=object(), canary=object(), canary_weight=0.9)
    local = RolloutController(router)  # a third replica that nobody nudges
    sync = RolloutSync(local, lambda: [a.url], admin_token=ADMIN_TOKEN, interval_s=0.05)
    sync.start()
    try:
        deadline = time.monotonic() + 20
        while MODEL not in local.last_events:
            assert time.monotonic() < deadline, "the periodic round never adopted a's event"
            time.sleep(0.02)
    finally:
        sync.stop()
    event = local.last_events[MODEL]
    # where it was decided travels along: a got it from b, so the third replica names b too
    assert (event.action, event.ts) == (newest["action"], newest["ts"])
    assert event.origin == (newest["origin"] or a.url) != ""
    assert router.route_of(MODEL).canary_weight == newest["canary_weight"]


def test_status_reports_disagreement_and_unreachable_replicas(
    pair: tuple[LiveServer, LiveServer], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = pair
    sock = bound_socket()
    dead = url_of(sock)  # bound, never listening: connection refused
    argv = ["status", "--url", a.url, "--url", dead, "--admin-token", ADMIN_TOKEN]
    try:
        assert _rollout(argv, capsys) == 1
    finally:
        sock.close()
    out = capsys.readouterr().out
    assert f"== {dead}" in out and "cannot reach" in out
    assert "1 of 2 replicas did not answer" in out
