"""Tenant isolation of the prefix cache, through the official openai client: with two API keys,
tenant B gets no cached tokens for tenant A's prompt (so it cannot learn what A sent) and the
same hit as A for its own repeat; a body's `cache_salt` narrows the namespace further; the admin
token sees the hit rate per tenant."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import httpx
import openai
import pytest

from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.stats import FanOut
from runtime.memory import Allocator
from runtime.server.openai.tenancy import prefix_salt, tenant_of
from tests.runtime.server.live import (
    ADMIN_TOKEN,
    LiveServer,
    light_settings,
    live_server,
    router_of,
)

KEY_A, KEY_B = "sk-tenant-a", "sk-tenant-b"
SYSTEM = "You answer questions about page tables and caches. " * 8  # several 16-token pages


def _own_allocator(path: Path, sink: FanOut) -> Engine:
    """Its own allocator, not the process-wide one: blocks other tests of this process leak on
    purpose (the debug leak setting) would be this engine's orphans in the idle self-check."""
    return Engine(
        EngineConfig(model_path=path, model_name="llama", device="cpu"),
        sink=sink,
        allocator=Allocator(device="cpu"),
    )


@pytest.fixture(scope="module")
def served(demo_model_dir: Callable[[str], Path]) -> Iterator[LiveServer]:
    make_router = router_of(llama=partial(_own_allocator, demo_model_dir("llama")))
    with live_server(light_settings(api_keys=[KEY_A, KEY_B]), make_router) as server:
        yield server


def cached(client: openai.OpenAI, prompt: str, **extra: str) -> int:
    out = client.completions.create(
        model="llama", prompt=prompt, max_tokens=1, temperature=0, extra_body=extra or None
    )
    assert out.usage is not None and out.usage.prompt_tokens_details is not None
    return out.usage.prompt_tokens_details.cached_tokens or 0


def test_tenant_b_never_hits_tenant_a_pages_and_gets_its_own(served: LiveServer) -> None:
    a = openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY_A, max_retries=0)
    b = openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY_B, max_retries=0)
    prompt = SYSTEM + " Which page holds token 40?"
    assert cached(a, prompt) == 0
    hit = cached(a, prompt)  # A's own repeat: every full page but the last token's
    assert hit > 0
    assert cached(b, prompt) == 0  # A's prompt is not visible to B
    assert cached(b, prompt) == hit  # B's own repeat: the same hit as A's
    # a cache_salt is a namespace of its own, inside the tenant's
    assert cached(b, prompt, cache_salt="team-x") == 0
    assert cached(b, prompt, cache_salt="team-x") == hit
    assert cached(a, prompt, cache_salt="team-x") == 0  # the same salt under another tenant

    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    report = httpx.get(f"{served.url}/admin/prefix-cache", headers=admin).json()
    assert report["shared_across_keys"] is False
    rows = {row["tenant"]: row for row in report["tenants"]}
    assert rows["key-1"]["requests"] == 3 and rows["key-1"]["cached_tokens"] == hit
    assert rows["key-2"]["requests"] == 4 and rows["key-2"]["cached_tokens"] == 2 * hit
    ratio = rows["key-2"]["cached_tokens"] / rows["key-2"]["prompt_tokens"]
    assert rows["key-2"]["hit_ratio"] == pytest.approx(ratio, abs=1e-6)
    # a tenant's key is not an admin token
    refused = httpx.get(
        f"{served.url}/admin/prefix-cache", headers={"Authorization": f"Bearer {KEY_A}"}
    )
    assert refused.status_code == 403


def test_an_empty_cache_salt_is_refused(served: LiveServer) -> None:
    body = {"model": "llama", "prompt": "hi", "max_tokens": 1, "cache_salt": ""}
    response = httpx.post(
        f"{served.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY_A}"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "cache_salt"


def test_tenants_are_named_by_key_position_never_the_key() -> None:
    keys = [KEY_A, KEY_B]
    assert tenant_of(f"Bearer {KEY_B}", keys) == "key-2"
    assert tenant_of("Bearer nope", keys) is None and tenant_of(None, []) is None
    salt = prefix_salt("key-2", None, shared=False)
    assert KEY_B not in salt and salt != prefix_salt("key-1", None, shared=False)
    # shared across keys: only the cache_salt separates; no salt at all keeps the open namespace
    assert prefix_salt("key-1", "s", shared=True) == prefix_salt("key-2", "s", shared=True)
    assert prefix_salt("key-1", None, shared=True) == "" == prefix_salt(None, None, shared=False)
    # no cache_salt can spell another tenant's namespace
    assert prefix_salt(None, '["key-1", ""]', shared=False) != prefix_salt(
        "key-1", None, shared=False
    )


def test_the_status_summary_shows_the_idle_self_check(served: LiveServer) -> None:
    """After the requests above the idle engine checks itself; the summary says it is clean
    (and the gauges on /metrics agree)."""
    a = openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY_A, max_retries=0)
    cached(a, "a short one")
    headers = {"Authorization": f"Bearer {KEY_A}"}
    version: dict = {}
    for _ in range(200):  # until the engine has been idle long enough to run its check
        body = httpx.get(f"{served.url}/status/api/summary", headers=headers).json()
        version = body["server"]["versions"][0]
        if version["kv_leaked_pages"] is not None:
            break
        time.sleep(0.1)
    assert version["kv_leaked_pages"] == 0 and version["allocator_orphan_blocks"] == 0
    metrics = httpx.get(f"{served.url}/metrics").text
    assert 'fastllm_kv_leaked_pages{model="llama",version="stable"} 0.0' in metrics
    assert 'fastllm_allocator_orphan_blocks{model="llama",version="stable"} 0.0' in metrics
