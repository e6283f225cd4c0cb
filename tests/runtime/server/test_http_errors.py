"""Raw HTTP edge cases: oversized and malformed bodies, readiness, admin token, overload."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.stats import FanOut
from runtime.models.loader import LoadedModel, load_model
from tests.runtime.engine.support import ModelHooks
from tests.runtime.server.live import (
    ADMIN_TOKEN,
    API_KEY,
    LiveServer,
    light_settings,
    live_server,
    router_of,
)

AUTH = {"Authorization": f"Bearer {API_KEY}"}
JSON = {**AUTH, "Content-Type": "application/json"}


def test_oversized_body_is_413_with_and_without_content_length(served: LiveServer) -> None:
    limit = served.state.settings.max_body_bytes
    big = b'{"model": "llama", "prompt": "' + b"a" * limit + b'"}'
    declared = httpx.post(f"{served.url}/v1/completions", content=big, headers=JSON)
    assert declared.status_code == 413
    assert declared.json()["error"]["type"] == "invalid_request_error"

    def chunked() -> Iterator[bytes]:  # a generator body: sent chunked, no Content-Length
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    streamed = httpx.post(f"{served.url}/v1/completions", content=chunked(), headers=JSON)
    assert streamed.status_code == 413


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"model": "llama", "prompt": "\xff\xfe"}', "UTF-8"),
        (b'{"model": "llama", "prompt": ', "JSON"),
        (b'{"model": "llama", "prompt": "x", "max_tokens": "5"}', "max_tokens"),
        (b'{"model": 7, "prompt": "x"}', "model"),
        (b"[1, 2]", "body"),
    ],
)
def test_malformed_bodies_are_400(served: LiveServer, body: bytes, needle: str) -> None:
    response = httpx.post(f"{served.url}/v1/completions", content=body, headers=JSON)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and needle in error["message"]


def test_admin_token(served: LiveServer) -> None:
    url = f"{served.url}/admin/memory"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 403
    assert httpx.get(url, headers=AUTH).status_code == 403  # an API key is not the admin token
    ok = httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert ok.status_code == 200 and ok.json()["allocators"][0]["device"] == "cpu"
    policy = httpx.post(
        f"{served.url}/admin/batch-policy",
        json={"min_util": 0.5, "max_util": 0.85, "step_size": 0.15},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert policy.status_code == 200
    controller_config = served.state.router.pick("llama").engine._parts.controller.stats().config
    assert (controller_config.min_util, controller_config.max_util) == (0.5, 0.85)
    assert controller_config.step_up == controller_config.step_down == 0.15
    bad = httpx.post(
        f"{served.url}/admin/batch-policy",
        json={"min_util": 0.9, "max_util": 0.5, "step_size": 0.1},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert bad.status_code == 400


def test_admin_batch_goal_sets_its_band(served: LiveServer) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    url = f"{served.url}/admin/batch-goal"
    response = httpx.post(url, json={"goal": "throughput"}, headers=admin)
    assert response.status_code == 200
    assert (response.json()["min_util"], response.json()["max_util"]) == (0.9, 1.0)
    config = served.state.router.pick("llama").engine._parts.controller.stats().config
    assert (config.min_util, config.max_util) == (0.9, 1.0)
    bad = httpx.post(url, json={"goal": "fastest"}, headers=admin)
    assert bad.status_code == 400 and bad.json()["error"]["param"] is not None
    assert httpx.post(url, json={"goal": "latency"}).status_code == 401
    httpx.post(url, json={"goal": "balanced"}, headers=admin)  # the module's server: as it was


def test_admin_refused_when_no_token_is_configured(demo_model_dir: Callable[[str], Path]) -> None:
    path = demo_model_dir("llama")
    make = router_of(llama=lambda sink: Engine(EngineConfig(model_path=path, device="cpu"), sink))
    with live_server(light_settings(admin_token=None, api_keys=[]), make) as server:
        response = httpx.get(f"{server.url}/admin/memory", headers={"Authorization": "Bearer x"})
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "admin_disabled"
        assert httpx.get(f"{server.url}/v1/models").status_code == 200  # no keys: open API


def test_503_until_the_model_is_loaded(demo_model_dir: Callable[[str], Path]) -> None:
    path = demo_model_dir("llama")
    gate = threading.Event()

    def slow_loader() -> LoadedModel:
        gate.wait(60)
        return load_model(path, device="cpu")

    def make_engine(sink: FanOut) -> Engine:
        return Engine(EngineConfig(model_path=path, device="cpu"), sink, loader=slow_loader)

    body = {"model": "llama", "prompt": "hi", "max_tokens": 2}
    with live_server(light_settings(), router_of(llama=make_engine), wait_ready=False) as server:
        assert httpx.get(f"{server.url}/health").status_code == 200
        ready = httpx.get(f"{server.url}/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "loading"
        refused = httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH)
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["type"] == "service_unavailable"
        gate.set()
        server.wait_ready()
        assert httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH).is_success


def test_overload_is_429_rate_limit_error(demo_model_dir: Callable[[str], Path]) -> None:
    loaded = load_model(demo_model_dir("llama"), device="cpu")
    hooks = ModelHooks(loaded)
    config = EngineConfig(model_name="llama", device="cpu", max_queued_requests=1)
    make = router_of(llama=lambda sink: Engine(config, sink, loader=lambda: loaded))
    with live_server(light_settings(), make) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        engine = server.state.router.pick("llama").engine
        hooks.hold()
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(
                client.completions.create, model="llama", prompt="a", max_tokens=2, temperature=0
            )
            assert hooks.entered.wait(30)
            queued = pool.submit(
                client.completions.create, model="llama", prompt="b", max_tokens=2, temperature=0
            )
            while engine.num_waiting < 1:
                assert not queued.done(), queued.exception()
                threading.Event().wait(0.01)
            with pytest.raises(openai.RateLimitError) as refused:
                client.completions.create(model="llama", prompt="c", max_tokens=2)
            assert int(refused.value.response.headers["Retry-After"]) >= 1
            hooks.release()
            assert running.result(30).usage.completion_tokens == 2
            assert queued.result(30).usage.completion_tokens == 2


def test_leaving_replica_says_not_ready_but_still_serves(served: LiveServer) -> None:
    """After SIGTERM, for `drain_unready_s`: load balancers see 503 on /ready and take the
    replica out, while requests that still arrive are served (runtime/server/lifecycle.py)."""
    served.state.drain.is_leaving = True
    try:
        ready = httpx.get(f"{served.url}/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        body = {"model": "llama", "prompt": "still here", "max_tokens": 2}
        assert httpx.post(f"{served.url}/v1/completions", json=body, headers=AUTH).is_success
    finally:
        served.state.drain.is_leaving = False
    assert httpx.get(f"{served.url}/ready").status_code == 200


def test_drain_withdraws_readiness_before_it_refuses_work() -> None:
    import asyncio
    from types import SimpleNamespace

    from runtime.server.lifecycle import Drain, drain

    stopped: list[float] = []
    state = SimpleNamespace(drain=Drain(), shutdown_engines=stopped.append)
    app = SimpleNamespace(state=SimpleNamespace(fastllm=state))

    async def run() -> None:
        task = asyncio.ensure_future(drain(app, grace_s=5.0, unready_s=0.2))
        await asyncio.sleep(0)  # drain runs up to its unready wait
        assert state.drain.is_leaving and not state.drain.is_draining
        assert stopped == []
        await task
        assert state.drain.is_draining and len(stopped) == 1

    asyncio.run(run())


def test_admin_memory_names_the_pages_each_request_holds(served: LiveServer) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    loaded = served.state.router.pick("llama").engine.loaded
    hooks = ModelHooks(loaded)
    hooks.sleep_s = 0.05  # slow steps: the request is still running when the report is read
    body = {"model": "llama", "prompt": "page " * 40, "max_tokens": 500, "ignore_eos": True}
    try:
        with httpx.stream(
            "POST", f"{served.url}/v1/completions", json={**body, "stream": True}, headers=AUTH
        ) as stream:
            lines = stream.iter_lines()  # held: a dropped iterator closes the stream (a cancel)
            first = next(line for line in lines if line.startswith("data: {"))
            rid = json.loads(first.removeprefix("data: "))["id"]
            report = httpx.get(f"{served.url}/admin/memory", headers=admin).json()
    finally:
        loaded.model.forward = hooks._forward  # type: ignore[method-assign]
    (allocator,) = report["allocators"]
    pool_rows = {f"kv-cache:llama/stable:{s}" for s in ("shared", "cached", "free", "zero-page")}
    rows = [b for b in allocator["live_blocks"] if b["owner"] in pool_rows]
    mine = [b for b in allocator["live_blocks"] if b["owner"] == rid]
    assert len(mine) == 1 and mine[0]["num_handles"] >= 3  # a 40-token prompt's pages
    kv = {k["model"]: k for k in report["kv_caches"]}["llama"]
    # the pool's rows (request, shared, cached, free, zero page) add up to every page
    assert sum(b["num_handles"] for b in rows + mine) == kv["num_pages"] + 1
    assert kv["num_used_pages"] >= mine[0]["num_handles"]
    page_bytes = mine[0]["nbytes"] // mine[0]["num_handles"]
    assert sum(b["nbytes"] for b in rows + mine) == (kv["num_pages"] + 1) * page_bytes


def test_a_prompt_longer_than_the_kv_pool_is_a_400_naming_the_limit(
    demo_model_dir: Callable[[str], Path],
) -> None:
    path = demo_model_dir("llama")
    config = EngineConfig(model_path=path, model_name="llama", device="cpu", kv_cache_bytes=1 << 19)
    make = router_of(llama=lambda sink: Engine(config, sink))
    with live_server(light_settings(), make) as server:
        engine = server.state.router.pick("llama").engine
        limit = engine._parts.kv_cache.max_tokens  # 63 pages of 16 tokens
        body = {"model": "llama", "prompt": [5] * (limit + 100), "max_tokens": 2}
        response = httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=30)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "prompt" and error["type"] == "invalid_request_error"
        assert f"({limit} tokens)" in error["message"] and "KV cache" in error["message"]
        assert engine.num_waiting == 0  # refused, not queued
