"""Speculative decoding through the server: the body's `speculative` opt-out (a non-boolean is a
400 in the API's error shape), the same text with and without it, and the acceptance counts in
/metrics and in the request's inference_log row; logprobs and a JSON-schema constrained request
through the official `openai` client, equal to the opted-out run."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from functools import partial
from pathlib import Path

from runtime.engine.spec.config import SpecConfig
from tests.runtime.server.inprocess import AUTH, in_process, metric_sum, storage_settings
from tests.runtime.server.live import API_KEY, engine_for, light_settings, live_server, router_of

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


def test_logprobs_speculate_and_equal_the_opted_out_run(
    demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """Through the official `openai` client: a greedy completion with logprobs drafts (the spec
    counters move, its inference_log row has drafts) and returns the same tokens and logprobs as
    the same request opted out of speculation."""
    import openai

    spec = SpecConfig(method="ngram", num_speculative_tokens=4, max_batch_for_speculation=64)
    make_router = router_of(
        llama=partial(
            engine_for, demo_model_dir("llama"), name="llama", spec=spec, batch_warmup=False
        )
    )
    settings = storage_settings(tmp_path, speculative_method="ngram")
    with in_process(settings, make_router) as app:
        client = openai.OpenAI(
            base_url=f"{app.client.base_url}/v1",
            api_key=AUTH["Authorization"].removeprefix("Bearer "),
            http_client=app.client,
            max_retries=0,
        )
        extra = {"return_tokens_as_token_ids": True}
        on, off = (
            client.completions.create(
                model="llama",
                prompt=PROMPT,
                max_tokens=24,
                temperature=0,
                logprobs=3,
                extra_body={**extra, **opt},
            )
            for opt in ({}, {"speculative": False})
        )
        registry = app.state.registry
        assert registry is not None
        drafted = metric_sum(registry, "fastllm_spec_decode_num_draft_tokens_total", method="ngram")
        accepted = metric_sum(
            registry, "fastllm_spec_decode_num_accepted_tokens_total", method="ngram"
        )
        app.rows(expected=2)
        assert app.db is not None
        with sqlite3.connect(app.db) as conn:
            query = "SELECT request_id, spec_draft_tokens FROM inference_log WHERE op IS NULL"
            rows = dict(conn.execute(query).fetchall())
    assert drafted > 0 and accepted > 0  # the logprobs request speculated, drafts were accepted
    assert rows[on.id] == drafted and rows[off.id] is None
    got, want = on.choices[0].logprobs, off.choices[0].logprobs
    assert got is not None and want is not None
    assert on.choices[0].text == off.choices[0].text and got.tokens == want.tokens
    assert got.tokens and len(got.tokens) == 24
    assert got.token_logprobs is not None and want.token_logprobs is not None
    for g, w in zip(got.token_logprobs, want.token_logprobs, strict=True):
        assert abs(g - w) < 1e-5
    assert got.top_logprobs is not None and want.top_logprobs is not None
    for g_top, w_top in zip(got.top_logprobs, want.top_logprobs, strict=True):
        assert g_top.keys() == w_top.keys()
        assert all(abs(g_top[t] - w_top[t]) < 1e-5 for t in w_top)


REPEATING = {  # a JSON schema whose outputs repeat themselves (n-gram drafts can hit)
    "type": "object",
    "properties": {
        "words": {
            "type": "array",
            "items": {"enum": ["one two", "one two three"]},
            "minItems": 4,
            "maxItems": 8,
        },
        "done": {"type": "boolean"},
    },
    "required": ["words", "done"],
    "additionalProperties": False,
}


def test_json_schema_speculates_over_a_live_server_and_equals_the_opted_out_run(
    demo_model_dir: Callable[[str], Path],
) -> None:
    """Through the official `openai` client against a live server (uvicorn on loopback): a greedy
    chat completion constrained by a JSON schema drafts (its drafts are judged under the grammar
    and some are accepted) and returns the same content as the same request opted out."""
    import openai
    from openai.types.chat import ChatCompletionMessageParam
    from openai.types.shared_params import ResponseFormatJSONSchema

    spec = SpecConfig(method="ngram", num_speculative_tokens=4, max_batch_for_speculation=64)
    make_router = router_of(
        llama=partial(
            engine_for, demo_model_dir("llama"), name="llama", spec=spec, batch_warmup=False
        )
    )
    with live_server(light_settings(speculative_method="ngram"), make_router) as server:
        client = openai.OpenAI(
            base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120
        )
        messages: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": 'List words: "one two", "one two", "one two"'}
        ]
        schema: ResponseFormatJSONSchema = {
            "type": "json_schema",
            "json_schema": {"name": "words", "schema": REPEATING, "strict": True},
        }
        on, off = (
            client.chat.completions.create(
                model="llama",
                messages=messages,
                max_tokens=120,
                temperature=0,
                response_format=schema,
                extra_body=opt,
            )
            for opt in ({}, {"speculative": False})
        )
        registry = server.state.registry
        assert registry is not None
        drafted = metric_sum(registry, "fastllm_spec_decode_num_draft_tokens_total", method="ngram")
        accepted = metric_sum(
            registry, "fastllm_spec_decode_num_accepted_tokens_total", method="ngram"
        )
    assert drafted > 0 and accepted > 0  # the constrained request speculated, drafts accepted
    content = on.choices[0].message.content
    assert content == off.choices[0].message.content
    assert on.choices[0].finish_reason == off.choices[0].finish_reason == "stop"
    parsed = json.loads(content or "")
    assert len(parsed["words"]) >= 4 and isinstance(parsed["done"], bool)
