"""Adapters loaded and unloaded while streams run on others (the issue's hot load/unload under
load, scaled to a CPU test): no request fails, no 5xx, every stream gets the tokens its adapter
gives it alone (so no KV page crossed adapters), and the allocator is back to its baseline once
the hot adapter is gone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest

from runtime.engine.engine import Engine
from runtime.engine.request import GenerationRequest
from runtime.serving.router import Router
from tests.runtime.engine.support import greedy
from tests.runtime.server.live import (
    ADMIN_TOKEN,
    API_KEY,
    LiveServer,
    engine_for,
    light_settings,
    live_server,
)

AUTH = {"Authorization": f"Bearer {API_KEY}"}
ADMIN = {**AUTH, "X-Admin-Token": ADMIN_TOKEN}
STABLE = ("a1", "a2", "a3", "a4")


@pytest.fixture(scope="module")
def served(base_dir: Path, adapter_dirs: dict[str, Path]) -> Iterator[LiveServer]:
    loras = tuple((name, str(adapter_dirs[name])) for name in STABLE)

    def make_router(sink) -> Router:
        router = Router()
        make = partial(engine_for, base_dir, name="llama", compile="off", max_loras=5, loras=loras)
        router.add("llama", stable=make(sink))
        for name in STABLE:
            router.add_adapter(name, "llama")
        return router

    settings = light_settings(model_path=str(base_dir), model_name="llama")
    with live_server(settings, make_router) as server:
        yield server


def test_streams_survive_hot_load_unload(served: LiveServer, adapter_dirs: dict[str, Path]) -> None:
    engine = served.state.router.pick("llama").engine
    assert isinstance(engine, Engine)
    shared = engine.tokenizer.encode("a shared system prompt that fills a few KV pages. " * 3)
    models = ["llama", *STABLE]
    prompts = {m: [*shared, 10 + i, 20 + i] for i, m in enumerate(models)}
    expected = {
        m: engine.submit(
            GenerationRequest(f"alone-{m}", prompts[m], greedy(6), lora="" if m == "llama" else m)
        )
        .result(60)
        .token_ids
        for m in models
    }
    baseline = engine.allocator_stats().bytes_in_use
    problems: list[str] = []

    def stream(worker: int) -> None:
        with httpx.Client(base_url=f"{served.url}/v1", headers=AUTH, timeout=60) as client:
            for i in range(4):
                model = models[(worker + i) % len(models)]
                body = {"model": model, "prompt": prompts[model], "max_tokens": 6,
                        "temperature": 0, "ignore_eos": True}  # fmt: skip
                response = client.post("/completions", json=body)
                if response.status_code != 200:
                    problems.append(f"{model}: {response.status_code} {response.text}")
                    continue
                text = response.json()["choices"][0]["text"]
                if text != engine.tokenizer.decode(expected[model]):
                    problems.append(f"{model}: got {text!r}")

    workers = [threading.Thread(target=stream, args=(w,)) for w in range(8)]
    for w in workers:
        w.start()
    cycles = 0
    with httpx.Client(base_url=f"{served.url}/v1", headers=ADMIN, timeout=60) as admin:
        while any(w.is_alive() for w in workers) or cycles < 10:
            load = {"lora_name": "hot", "lora_path": str(adapter_dirs["a4"].parent / "a2")}
            loaded = admin.post("/load_lora_adapter", json=load)
            hot = admin.post(
                "/completions", json={"model": "hot", "prompt": [5, 6], "max_tokens": 2}
            )
            gone = admin.post("/unload_lora_adapter", json={"lora_name": "hot"})
            for response in (loaded, hot, gone):
                if response.status_code != 200:
                    problems.append(f"hot: {response.status_code} {response.text}")
            cycles += 1
    for w in workers:
        w.join(120)
    assert not problems, problems[:5]
    assert cycles >= 10
    live = [(b.owner, b.reserved_bytes, b.tier) for b in engine.leak_report()]
    assert engine.allocator_stats().bytes_in_use == baseline, live
