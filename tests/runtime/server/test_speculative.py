"""Speculative decoding through the server: the body's `speculative` opt-out (a non-boolean is a
400 in the API's error shape), the same text with and without it, and the acceptance counts in
/metrics and in the request's inference_log row."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from functools import partial
from pathlib import Path

from runtime.engine.spec.config import SpecConfig
from tests.runtime.server.inprocess import AUTH, in_process, metric_sum, storage_settings
from tests.runtime.server.live import engine_for, router_of

PROMPT = "one two three one two three one two three one two three one two"


def test_opt_out_same_text_and_counts_recorded(
    demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    spec = SpecConfig(method="ngram", num_speculative_tokens=4, max_batch_for_speculation=64)
    make_router = router_of(
        llama=partial(
            engine_for, demo_model_dir("llama"), name="llama", spec=spec, batch_warmup=False
        )
    )
    settings = storage_settings(tmp_path, speculative_method="ngram")
    with in_process(settings, make_router) as app:
        body = {"model": "llama", "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
        on = app.client.post("/v1/completions", json=body, headers=AUTH)
        off = app.client.post("/v1/completions", json={**body, "speculative": False}, headers=AUTH)
        bad = app.client.post("/v1/completions", json={**body, "speculative": "no"}, headers=AUTH)
        assert on.status_code == off.status_code == 200, (on.text, off.text)
        assert on.json()["choices"][0]["text"] == off.json()["choices"][0]["text"]
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "speculative"
        app.rows(expected=2)
        registry = app.state.registry
        assert registry is not None
        drafted = metric_sum(registry, "fastllm_spec_decode_num_draft_tokens_total", method="ngram")
        accepted = metric_sum(
            registry, "fastllm_spec_decode_num_accepted_tokens_total", method="ngram"
        )
        assert drafted > 0 and 0 <= accepted <= drafted
        assert app.db is not None
        with sqlite3.connect(app.db) as conn:
            query = "SELECT request_id, spec_draft_tokens FROM inference_log WHERE op IS NULL"
            rows = dict(conn.execute(query).fetchall())
    assert rows[on.json()["id"]] == drafted  # the one request that drafted
    assert rows[off.json()["id"]] is None  # opted out: nothing drafted, NULL
