"""Issue 39, item 2: heavy request work runs off the event loop, a prompt that cannot fit is
refused before it is tokenized, and a response past `max_response_bytes` is refused up front.

No timings: each heavy step is held on an Event the test controls, and `/health` (or a plain
chat) must complete while it is held. On the loop, the held step would stop both (each wait has
a guard so such a failure ends instead of hanging the suite)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer

from runtime.server import offload
from runtime.server.openai.response_size import chat_shape, completion_shape
from tests.runtime.server.inprocess import AUTH, InProcess, in_process
from tests.runtime.server.live import engine_for, light_settings, router_of

GUARD_S = 60.0  # a hang guard, not a timing: the held work is released well before


@pytest.fixture(scope="module")
def app(demo_model_dir: Callable[[str], Path]) -> Iterator[InProcess]:
    make_router = router_of(llama=partial(engine_for, demo_model_dir("llama"), name="llama"))
    with in_process(light_settings(max_response_bytes=1 << 16), make_router) as served:
        yield served


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def _tokenizer(app: InProcess) -> Any:
    return app.state.router.pick("llama").engine.tokenizer


def _held(entered: threading.Event, release: threading.Event, threads: list[str]) -> None:
    threads.append(threading.current_thread().name)
    entered.set()
    assert release.wait(GUARD_S)


def test_a_large_response_is_built_off_the_loop_while_health_answers(
    app: InProcess, pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()
    threads: list[str] = []
    real = offload.json_bytes

    def held_json(payload: Any) -> bytes:
        _held(entered, release, threads)
        return real(payload)

    monkeypatch.setattr(offload, "json_bytes", held_json)
    body = {"model": "llama", "prompt": "hello", "max_tokens": 4, "logprobs": 3, "echo": True}
    heavy = pool.submit(app.client.post, "/v1/completions", json=body, headers=AUTH)
    try:
        assert entered.wait(GUARD_S), "the response was never built"
        health = pool.submit(app.client.get, "/health")
        assert health.result(GUARD_S).status_code == 200  # while the build is held
        assert not heavy.done()
    finally:
        release.set()
    response = heavy.result(GUARD_S)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["logprobs"]["top_logprobs"]
    assert threads and all(name.startswith("fastllm-offload") for name in threads)


def test_a_long_tokenize_runs_off_the_loop_while_a_plain_chat_completes(
    app: InProcess, pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = _tokenizer(app)
    entered, release = threading.Event(), threading.Event()
    threads: list[str] = []
    real = tokenizer.encode

    def encode(text: str, **kwargs: Any) -> list[int]:
        if len(text) >= offload.INLINE_CHARS:  # the long /tokenize prompts only
            _held(entered, release, threads)
        ids: list[int] = real(text, **kwargs)
        return ids

    monkeypatch.setattr(tokenizer, "encode", encode)
    long_body = {"model": "llama", "prompt": "lorem ipsum dolor " * 4000}  # 72,000 characters
    heavies = [
        pool.submit(app.client.post, "/tokenize", json=long_body, headers=AUTH) for _ in range(2)
    ]
    try:
        assert entered.wait(GUARD_S)
        chat = {"model": "llama", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        plain = pool.submit(app.client.post, "/v1/chat/completions", json=chat, headers=AUTH)
        assert plain.result(GUARD_S).status_code == 200  # while the long ones are held
        assert not any(h.done() for h in heavies)
    finally:
        release.set()
    reference = HFTokenizer.from_str(tokenizer.backend.to_str())  # the library, not our wrapper
    expected = reference.encode(long_body["prompt"]).ids
    for heavy in heavies:
        reply = heavy.result(GUARD_S)
        assert reply.status_code == 200, reply.text
        assert reply.json()["tokens"] == expected
        assert (
            reply.content
            == json.dumps(  # the bytes the JSON encoder wrote before
                {
                    "count": len(expected),
                    "max_model_len": reply.json()["max_model_len"],
                    "tokens": expected,
                    "token_strs": None,
                },
                separators=(",", ":"),
            ).encode()
        )
    assert threads and all(name.startswith("fastllm-offload") for name in threads)


def test_a_prompt_past_the_character_bound_is_refused_before_tokenizing(
    app: InProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = _tokenizer(app)
    encoded: list[int] = []  # the length of each text encoded
    real = tokenizer.encode

    def encode(text: str, **kwargs: Any) -> list[int]:
        encoded.append(len(text))
        ids: list[int] = real(text, **kwargs)
        return ids

    monkeypatch.setattr(tokenizer, "encode", encode)
    prompt = "the quick brown fox jumps over the lazy dog " * 20_000  # 880,000 characters
    body = {"model": "llama", "prompt": prompt, "max_tokens": 1}
    reply = app.client.post("/v1/completions", json=body, headers=AUTH)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "prompt" and "exceeds the model's context" in error["message"]
    assert not any(length > 100_000 for length in encoded)  # none was tokenized in full
    # the refusal is true: the library counts far more tokens than the context
    context = int(app.state.router.pick("llama").engine.loaded.args.max_position_embeddings)
    assert len(HFTokenizer.from_str(tokenizer.backend.to_str()).encode(prompt).ids) > context
    # a chat the same: its rendered text is bounded before it is encoded
    chat = {"model": "llama", "messages": [{"role": "user", "content": prompt}]}
    reply = app.client.post("/v1/chat/completions", json=chat, headers=AUTH)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "messages"
    assert not any(length > 100_000 for length in encoded)
    # and a Message: Anthropic's words, which clients read to compact their history
    message = {"model": "llama", "max_tokens": 4, "messages": [{"role": "user", "content": prompt}]}
    reply = app.client.post("/v1/messages", json=message, headers=AUTH)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"].startswith("prompt is too long")
    assert not any(length > 100_000 for length in encoded)


def test_a_response_past_max_response_bytes_is_refused_before_it_runs(
    app: InProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = app.state.router.pick("llama").engine
    submitted: list[str] = []
    real = engine.submit

    def submit(request: Any) -> Any:
        submitted.append(request.request_id)
        return real(request)

    monkeypatch.setattr(engine, "submit", submit)
    ids = list(range(3, 203))  # 200 prompt tokens
    body = {
        "model": "llama",
        "prompt": [ids] * 8,
        "n": 4,
        "max_tokens": 16,
        "echo": True,
        "logprobs": 20,
    }
    reply = app.client.post("/v1/completions", json=body, headers=AUTH)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "logprobs" and "max_response_bytes" in error["message"]
    chat = {
        "model": "llama",
        "messages": [{"role": "user", "content": "hi"}],
        "n": 16,
        "max_tokens": 200,
        "logprobs": True,
        "top_logprobs": 20,
    }
    reply = app.client.post("/v1/chat/completions", json=chat, headers=AUTH)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "logprobs"
    assert submitted == []  # decided before any prompt was queued
    # the same body streamed is sent a chunk at a time: not refused
    small = {**body, "prompt": [ids], "n": 1, "max_tokens": 2, "stream": True}
    assert app.client.post("/v1/completions", json=small, headers=AUTH).status_code == 200


def test_the_size_estimate_is_a_lower_bound_of_the_real_response(app: InProcess) -> None:
    """A refusal is only ever for a body whose full-length response would pass the limit."""
    ids = list(range(3, 43))
    body = {
        "model": "llama",
        "prompt": [ids, ids[:20]],
        "n": 2,
        "max_tokens": 12,
        "echo": True,
        "logprobs": 5,
        "ignore_eos": True,
    }
    reply = app.client.post("/v1/completions", json=body, headers=AUTH)
    assert reply.status_code == 200, reply.text
    prompts: list[list[int]] = [ids, ids[:20]]
    shape = completion_shape(list(prompts), prompts, n=2, max_tokens=12, echo=True, logprobs=5)
    assert shape.estimate_bytes <= len(reply.content) <= 8 * shape.estimate_bytes
    chat = {
        "model": "llama",
        "messages": [{"role": "user", "content": "hi"}],
        "n": 3,
        "max_tokens": 10,
        "logprobs": True,
        "top_logprobs": 4,
        "ignore_eos": True,
    }
    reply = app.client.post("/v1/chat/completions", json=chat, headers=AUTH)
    assert reply.status_code == 200, reply.text
    estimate = chat_shape(n=3, max_tokens=10, logprobs=True, top_logprobs=4).estimate_bytes
    assert estimate <= len(reply.content) <= 8 * estimate


def test_the_piecewise_json_is_the_standard_librarys() -> None:
    payload = {
        "id": "cmpl-1",
        "choices": [
            {
                "index": i,
                "text": 'h\u00e9llo "x"\n',
                "logprobs": {
                    "tokens": ["a", "\u4e2d"],
                    "token_logprobs": [None, -0.5],
                    "top_logprobs": [None, {"a": -0.1, "b": -2.25}],
                    "text_offset": [0, 1],
                },
                "finish_reason": "length",
            }
            for i in range(3)
        ],
        "usage": {"prompt_tokens": 2, "details": {}},
        "empty": [],
    }
    standard = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    assert offload.json_bytes(payload) == standard.encode("utf-8")
    with pytest.raises(ValueError):
        offload.json_bytes({"choices": [{"logprob": float("nan")}]})


def test_long_lists_are_encoded_as_the_standard_library_does() -> None:
    """Slices cut at every boundary: scalar lists past SCALAR_SLICE, rows past ROW_SLICE, empty
    and one-item lists, a list of lists at the bottom depth."""
    rows = offload.ROW_SLICE * 3 + 1
    payload = {
        "count": 3,
        "tokens": list(range(offload.SCALAR_SLICE * 2 + 5)),
        "texts": ["\u00e9", 'q"', "\n"] * (offload.SCALAR_SLICE // 2),
        "choices": [
            {
                "logprobs": {
                    "top_logprobs": [None] + [{"a": -0.5, "\u4e2d": -1.25}] * rows,
                    "content": [{"token": "x", "bytes": [120], "top_logprobs": []}] * rows,
                    "nested": [[1, 2], [], [3]],
                    "one": [7],
                    "empty": [],
                }
            }
        ],
    }
    standard = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    assert offload.json_bytes(payload) == standard.encode("utf-8")


def test_a_long_list_is_encoded_a_slice_per_call_not_an_element_per_call() -> None:
    """/tokenize's reply of 100,000 ids: one encoder call per slice (the per-element version
    made 100,000 calls, each building an encoder: 1.5 s of GIL for a 1 MB prompt's reply)."""
    ids = list(range(100_000))
    pieces = list(offload._pieces({"count": len(ids), "tokens": ids}, offload._SPLIT_DEPTH))
    assert len(pieces) < 100  # 25 slices of 4,096 and the object's own punctuation
