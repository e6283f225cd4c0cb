"""A tensor-parallel (TP=2, gloo, two CPU processes) tiny llama through the server and the
official `openai` client: greedy completions (32 tokens, with logprobs asked) equal the
one-process engine's text, `/admin/memory` and the status page's summary list both ranks, and
/metrics carries the TP series. The tiny Gemma (its scaled embedding, GeGLU and tied head split
the same way) the same way, compared token id by token id.
(SmolLM2 through the server at TP=3: tests/runtime/engine/test_tp_real.py.)"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import openai

from runtime.engine.offline import generate
from runtime.engine.sampling import SamplingParams
from runtime.models.loader import load_model
from tests.fixtures.browser import console_errors
from tests.runtime.server.live import (
    ADMIN_TOKEN,
    API_KEY,
    engine_for,
    light_settings,
    live_server,
    router_of,
)
from tests.runtime.server.test_status_browser import wait_for

PROMPTS = [[5, 17, 42, 99, 7], list(range(40, 75))]
TOKEN_KEY = "fastllm-status-token"  # runtime/server/status/static/status.js


def test_tp2_server_matches_one_process(
    demo_model_dir: Callable[[str], Path], browser: Callable[[int, int], Any]
) -> None:
    path = demo_model_dir("llama")
    make_router = router_of(
        llama=partial(
            engine_for, path, name="llama", tensor_parallel_size=2, kv_cache_bytes=4 << 20
        )
    )
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with live_server(light_settings(tensor_parallel_size=2), make_router) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        replies = [
            client.completions.create(
                model="llama", prompt=p, max_tokens=32, temperature=0, logprobs=1
            )
            for p in PROMPTS
        ]
        memory = httpx.get(f"{server.url}/admin/memory", headers=headers).json()
        summary = httpx.get(f"{server.url}/status/api/summary", headers=headers).json()
        metrics = httpx.get(f"{server.url}/metrics").text
        driver = browser(1280, 800)  # the status page draws a row per rank
        # a user's key (no admin needed), in the tab's storage before the page starts polling:
        # entered after the load, a refused poll still in flight logs its 401 after the check
        driver.get(f"{server.url}/health")  # same origin: the page's sessionStorage
        driver.execute_script(f"sessionStorage.setItem('{TOKEN_KEY}', '{API_KEY}')")
        driver.get(f"{server.url}/")
        # the JSON page's favicon 404 (Chromium asks every page for one) is not the status page's
        errors = lambda: [e for e in console_errors(driver) if "/favicon.ico" not in e["message"]]  # noqa: E731
        shown = wait_for(
            lambda: driver.execute_script(
                "return [...document.querySelectorAll('#memory tr[data-rank]')].map("
                "e => e.dataset.rank)"
            ),
            "the tensor-parallel ranks' rows",
        )
        assert shown == ["0", "1"] and errors() == []
    offline = load_model(path, device="cpu")
    params = SamplingParams(max_tokens=32, temperature=0.0, logprobs=1)
    expected = generate(offline, PROMPTS, params)
    tokenizer = offline.tokenizer
    assert tokenizer is not None
    for reply, want in zip(replies, expected, strict=True):
        choice = reply.choices[0]
        assert choice.text == tokenizer.decode(want.token_ids)
        assert reply.usage is not None and reply.usage.completion_tokens == 32
        assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
        assert len(choice.logprobs.token_logprobs) == 32
    assert [r["rank"] for r in memory["tp_ranks"]] == [0, 1]
    assert all(r["alive"] and r["kv_pool_bytes"] > 0 for r in memory["tp_ranks"])
    (version,) = summary["server"]["versions"]  # the status page's per-rank memory
    assert [r["rank"] for r in version["tp_ranks"]] == [0, 1]
    assert all(r["alive"] and r["rss_bytes"] > 0 for r in version["tp_ranks"])
    assert 'fastllm_tp_worker_restarts_total{model="llama",version="stable"} 0.0' in metrics
    assert 'fastllm_tp_rank_memory_bytes{model="llama",rank="1",type="rss"' in metrics


def test_tp2_gemma_server_matches_one_process(demo_model_dir: Callable[[str], Path]) -> None:
    path = demo_model_dir("gemma")
    make_router = router_of(
        gemma=partial(
            engine_for, path, name="gemma", tensor_parallel_size=2, kv_cache_bytes=4 << 20
        )
    )
    with live_server(light_settings(tensor_parallel_size=2), make_router) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        replies = [
            client.completions.create(
                model="gemma",
                prompt=p,
                max_tokens=32,
                temperature=0,
                logprobs=1,
                extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True},
            )
            for p in PROMPTS
        ]
    expected = generate(
        load_model(path, device="cpu"),
        PROMPTS,
        SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True),
    )
    for reply, want in zip(replies, expected, strict=True):
        logprobs = reply.choices[0].logprobs
        assert logprobs is not None and logprobs.tokens is not None
        assert [int(t.removeprefix("token_id:")) for t in logprobs.tokens] == want.token_ids
        assert len(want.token_ids) == 32
