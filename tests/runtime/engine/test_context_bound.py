"""Issue 39, finding 9: a checkpoint whose context length is far beyond what this server's KV pool
holds is served up to the pool: the rope table is sized to the pool, not to the header (2**24
positions would be a table of gigabytes, once a 500 on every request), generation matches the
same model with an ordinary context, and a prompt past the pool is a 400 naming the limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.errors import InvalidRequestError
from runtime.models.bounds import MAX_CONTEXT_POSITIONS
from tests.runtime.engine.support import greedy, make_engine, one_torch_thread, request
from tests.runtime.models.builders import build_llama

pytestmark = pytest.mark.usefixtures(one_torch_thread.__name__)
KV_BYTES = 1 << 20  # a small pool: a few thousand tokens of the tiny llama


def generate(model_dir: Path, prompt: list[int]) -> tuple[list[int], int, int]:
    engine, _ = make_engine(model_dir, kv_cache_bytes=KV_BYTES)
    try:
        out = engine.submit(request("r", prompt, greedy(6))).result(timeout=120)
        parts = engine._parts
        table = parts.loaded.model.rope_table()  # type: ignore[operator]
        with pytest.raises(InvalidRequestError, match=r"KV cache|context is"):
            engine.submit(request("long", [5] * (parts.kv_cache.max_tokens + 1), greedy(1)))
        return list(out.token_ids), table.max_positions, parts.kv_cache.max_tokens
    finally:
        engine.shutdown()


def test_context_beyond_the_pool_is_served_up_to_the_pool(tmp_path: Path) -> None:
    ordinary = build_llama(tmp_path / "ordinary")
    huge = tmp_path / "huge"
    huge.mkdir()
    for item in ordinary.iterdir():
        (huge / item.name).write_bytes(item.read_bytes())
    cfg = json.loads((huge / "config.json").read_text())
    (huge / "config.json").write_text(
        json.dumps({**cfg, "max_position_embeddings": MAX_CONTEXT_POSITIONS})
    )
    prompt = [5, 17, 33, 2, 9]
    expected, _, _ = generate(ordinary, prompt)
    got, rope_rows, kv_tokens = generate(huge, prompt)
    assert got == expected
    assert rope_rows <= kv_tokens < MAX_CONTEXT_POSITIONS
