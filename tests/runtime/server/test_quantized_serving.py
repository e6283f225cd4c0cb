"""A quantized tiny model through the server and the official `openai` client: greedy tokens equal
the offline engine's on the same quantized weights, `/admin/memory` reports weight bytes by
format, and the engine loop runs model ops at the configured thread count."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx
import openai
import pytest
import torch

from runtime.engine.offline import generate
from runtime.engine.sampling import SamplingParams
from runtime.models.loader import load_model
from tests.runtime.server.live import (
    ADMIN_TOKEN,
    API_KEY,
    engine_for,
    light_settings,
    live_server,
    router_of,
)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_model_serves_the_engines_greedy_tokens(
    method: str, demo_model_dir: Callable[[str], Path]
) -> None:
    path = demo_model_dir("llama")
    make_router = router_of(
        llama=partial(engine_for, path, name="llama", quantization=method, num_threads=1)
    )
    with live_server(light_settings(), make_router) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        prompt = [5, 17, 42, 99, 7]
        reply = client.completions.create(model="llama", prompt=prompt, max_tokens=8, temperature=0)
        engine = server.state.router.pick("llama").engine
        assert engine.loaded.quantization is not None
        assert engine.loaded.quantization.method == method
        # the loop thread applied the setting itself (OpenMP's count is per thread)
        assert engine._parts.core.num_threads == 1
        memory = httpx.get(
            f"{server.url}/admin/memory", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ).json()
    (weights,) = memory["weights"]
    assert weights["quantization"] == method
    assert weights["bytes_by_format"][method] > 0
    assert weights["bytes_by_format"]["float32"] > 0  # embeddings and norms

    offline = load_model(path, device="cpu", quantization=method)
    (expected,) = generate(offline, [prompt], SamplingParams(max_tokens=8, temperature=0.0))
    tokenizer = offline.tokenizer
    assert tokenizer is not None
    assert reply.choices[0].text == tokenizer.decode(expected.token_ids)
    assert reply.usage is not None and reply.usage.completion_tokens == 8


def test_num_threads_zero_means_the_physical_cores() -> None:
    import psutil

    from runtime.engine.threads import apply_num_threads, resolve_num_threads

    before = torch.get_num_threads()
    try:
        assert resolve_num_threads(0) == (psutil.cpu_count(logical=False) or 1)
        assert apply_num_threads(1) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
