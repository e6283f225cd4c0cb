"""Canary rollout through a live server: a canary with a faulty op is rolled back automatically
(alert_events row, metrics, traffic back on stable, version labels on inference_log rows);
weight changes, rollback and promotion under load fail no request; `fastllm rollout` drives the
admin API."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from runtime.cli import main
from runtime.engine.stats import FanOut
from runtime.models import ops
from runtime.serving.router import Router
from storage import InferenceLog, MetricStore, open_database
from tests.runtime.server.live import (
    ADMIN_TOKEN,
    API_KEY,
    engine_for,
    light_settings,
    live_server,
)

MODEL = "tiny"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _canary_router(stable: Path, canary: Path, weight: float) -> Callable[[FanOut], Router]:
    def make(sink: FanOut) -> Router:
        router = Router()
        router.add(
            MODEL,
            stable=engine_for(stable, sink, name=MODEL, model_version="stable"),
            canary=engine_for(canary, sink, name=MODEL, model_version="canary"),
            canary_weight=weight,
        )
        return router

    return make


def _complete(url: str, user: str) -> httpx.Response:
    body = {"model": MODEL, "prompt": "The cache", "max_tokens": 3, "user": user}
    return httpx.post(f"{url}/v1/completions", json=body, headers=AUTH, timeout=60)


def _samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(f"{url}/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_faulty_canary_is_rolled_back_automatically(
    demo_model_dir: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_geglu(gate: Any, up: Any) -> Any:  # only the gemma canary runs geglu
        raise RuntimeError("injected fault in geglu")

    monkeypatch.setattr(ops, "geglu", broken_geglu)
    url_db = f"sqlite:///{tmp_path / 'fastllm.db'}"
    settings = light_settings(storage_enabled=True, database_url=url_db, rollout_min_requests=10)
    make = _canary_router(demo_model_dir("llama"), demo_model_dir("gemma"), weight=0.5)
    with live_server(settings, make) as server:
        statuses = []
        for i in range(200):
            statuses.append(_complete(server.url, f"user-{i}").status_code)
            status = httpx.get(f"{server.url}/admin/rollout", headers=ADMIN).json()
            if status["canary_weight"] == 0.0:
                break
        assert status["canary_weight"] == 0.0, "the faulty canary was never rolled back"
        assert status["last_event"]["automatic"] and status["last_event"]["reason"] == "error_rate"
        assert 500 in statuses  # the canary did fail before the rollback
        success = "fastllm_request_success_total"
        # request stats reach the metrics one engine-loop turn after the response: wait for the
        # counter to show every 200 so far (the canary's geglu always fails, so 200 = stable)
        expected = statuses.count(200)
        _settle(server.url, success, expected, model=MODEL, version="stable")
        after = [_complete(server.url, f"user-{i}").status_code for i in range(20)]
        assert after == [200] * 20  # every user, canary ones included, is back on stable
        samples = _settle(server.url, success, expected + 20, model=MODEL, version="stable")
        assert _total(samples, success, model=MODEL, version="stable") == expected + 20
        assert _total(samples, success, model=MODEL, version="canary") == 0.0
        labels = {"model": MODEL, "version": "canary", "reason": "error_rate"}
        assert _value(samples, "fastllm_rollout_rollbacks_total", **labels) == 1.0
        assert _value(samples, "fastllm_rollout_canary_weight", model=MODEL) == 0.0
        failed = {"model": MODEL, "version": "canary", "reason": "internal"}
        failed["endpoint"] = "completions"
        assert _value(samples, "fastllm_request_failure_total", **failed) >= 10
        events = _wait_for(
            lambda: MetricStore(url_db).alert_events(alertname="FastllmCanaryRolledBack")
        )
    (event,) = events
    assert event.state == "firing" and event.labels == labels
    assert "error rate exceeds stable" in event.annotations["description"]
    engine = open_database(url_db)
    with engine.connect() as conn:
        rows = conn.execute(select(InferenceLog.version, InferenceLog.status)).all()
    engine.dispose()
    assert ("canary", "internal") in rows and ("stable", "length") in rows


def _total(samples: dict[Any, float], name: str, **labels: str) -> float:
    """Sum of the samples `name` whose labels include `labels` (e.g. over finished_reason)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def _settle(
    url: str, name: str, want: float, timeout_s: float = 20.0, **labels: str
) -> dict[Any, float]:
    """Scrape until `_total(name, labels)` reads `want` (or the timeout); then a fresh scrape."""
    _wait_for(lambda: [want] if _total(_samples(url), name, **labels) == want else [], timeout_s)
    return _samples(url)


def _wait_for(read: Callable[[], list[Any]], timeout_s: float = 20.0) -> list[Any]:
    """Poll `read` until it returns something; fails (never returns empty) at the timeout."""
    deadline = time.monotonic() + timeout_s
    while not (found := read()):
        assert time.monotonic() < deadline, f"nothing after {timeout_s}s from {read}"
        time.sleep(0.1)
    return found


def test_no_request_fails_while_weights_change_and_the_canary_is_promoted(
    demo_model_dir: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    llama = demo_model_dir("llama")
    settings = light_settings(storage_enabled=False)
    with live_server(settings, _canary_router(llama, llama, weight=0.0)) as server:
        statuses: list[int] = []
        stop = threading.Event()

        errors: list[str] = []

        def client(n: int) -> None:
            i = 0
            while not stop.is_set():
                try:
                    statuses.append(_complete(server.url, f"c{n}-{i}").status_code)
                except Exception as exc:  # a request that never got an answer fails too
                    errors.append(f"c{n}-{i}: {exc!r}")
                    return
                i += 1

        threads = [threading.Thread(target=client, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        cli = ["--url", server.url, "--admin-token", ADMIN_TOKEN]
        try:
            for argv in (["set", "--weight", "0.5"], ["set", "--weight", "1"], ["rollback"]):
                _wait_requests(statuses, 6)
                assert _rollout([*argv, *cli], capsys) == 0
            _wait_requests(statuses, 6)
            assert _rollout(["promote", *cli], capsys) == 0
            _wait_requests(statuses, 6)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        assert not errors, errors
        assert statuses and set(statuses) == {200}, statuses
        assert _rollout(["status", *cli], capsys) == 0
        out = capsys.readouterr().out
        assert "stable: canary" in out and "canary: none" in out
        samples = _samples(server.url)
        events = {"model": MODEL}
        assert _value(samples, "fastllm_rollout_events_total", action="promote", **events) == 1


def _wait_requests(statuses: list[int], n: int, timeout_s: float = 60.0) -> None:
    """Let `n` more requests complete (traffic flows across each switch); fails when they do not
    within the timeout, so a window without traffic cannot pass as "no request failed"."""
    target = len(statuses) + n
    deadline = time.monotonic() + timeout_s
    while len(statuses) < target:
        assert time.monotonic() < deadline, f"only {len(statuses)} of {target} requests done"
        time.sleep(0.02)


def _rollout(argv: list[str], capsys: pytest.CaptureFixture[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(["rollout", *argv])
        raise SystemExit(0)
    return int(exc.value.code or 0)


def test_rollout_endpoints_need_the_admin_token(demo_model_dir: Callable[[str], Path]) -> None:
    llama = demo_model_dir("llama")
    with live_server(light_settings(), _canary_router(llama, llama, 0.1)) as server:
        body = {"action": "set", "weight": 0.5}
        assert httpx.post(f"{server.url}/admin/rollout", json=body).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert (
            httpx.post(f"{server.url}/admin/rollout", json=body, headers=wrong).status_code == 403
        )
        bad = httpx.post(f"{server.url}/admin/rollout", json={"action": "set"}, headers=ADMIN)
        assert bad.status_code == 400  # set needs a weight
        assert (
            httpx.post(
                f"{server.url}/admin/rollout", json={**body, "weight": 2}, headers=ADMIN
            ).status_code
            == 400
        )
        done = httpx.post(f"{server.url}/admin/rollout", json=body, headers=ADMIN).json()
        assert done["canary_weight"] == 0.5 and done["canary"] == "canary"
        promote = {"action": "promote"}
        assert httpx.post(f"{server.url}/admin/rollout", json=promote, headers=ADMIN).is_success
        again = httpx.post(f"{server.url}/admin/rollout", json=body, headers=ADMIN)
        assert again.status_code == 409 and "no canary" in again.json()["error"]["message"]
