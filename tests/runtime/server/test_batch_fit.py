"""A batch that can never be queued is a 400 at once naming the bound, one row, nothing queued
(issue 39, item 5: it was a retryable 429 after its first prompts were queued and cancelled)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runtime.errors import Overloaded
from runtime.server.openai.batch_fit import check_batch_fits
from tests.runtime.server.inprocess import AUTH, InProcess, in_process, storage_settings
from tests.runtime.server.live import engine_for, router_of

QUEUE = 8


@pytest.fixture(scope="module")
def app(
    demo_model_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcess]:
    engine = partial(engine_for, demo_model_dir("llama"), name="llama", max_queued_requests=QUEUE)
    settings = storage_settings(tmp_path_factory.mktemp("batch-fit"))
    with in_process(settings, router_of(llama=engine)) as served:
        yield served


def _statuses(app: InProcess) -> dict[str, int]:
    assert app.state.writer is not None and app.db is not None
    assert app.state.writer.flush(30)
    with sqlite3.connect(app.db) as conn:
        rows = conn.execute("SELECT status, COUNT(*) FROM inference_log GROUP BY status")
        return {status: count for status, count in rows}


def test_a_batch_past_the_queue_is_a_400_with_one_row_and_nothing_queued(
    app: InProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = app.state.router.pick("llama").engine
    submitted: list[str] = []
    real = engine.submit

    def submit(request: Any) -> Any:
        submitted.append(request.request_id)
        return real(request)

    monkeypatch.setattr(engine, "submit", submit)
    before = app.barrier_rows()
    submitted.clear()  # the barrier's own request
    body = {"model": "llama", "prompt": ["a", "b", "c"], "n": 3, "max_tokens": 2}  # 9 > 8
    reply = app.client.post("/v1/completions", json=body, headers=AUTH)
    assert reply.status_code == 400, reply.text
    assert "retry-after" not in reply.headers
    error = reply.json()["error"]
    assert error["param"] == "prompt" and "max_queued_requests" in error["message"]
    assert "9 sequences" in error["message"] and f"({QUEUE}," in error["message"]
    assert submitted == []
    statuses = _statuses(app)
    assert "cancelled" not in statuses
    assert app.barrier_rows() == before + 2  # the refusal's one row, and the barrier's
    # a batch that fits the queue runs
    fits = {**body, "n": 2}  # 6 sequences
    assert app.client.post("/v1/completions", json=fits, headers=AUTH).status_code == 200


def test_a_batch_with_one_prompt_past_the_context_queues_none_of_it(
    app: InProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = app.state.router.pick("llama").engine
    context = int(engine.loaded.args.max_position_embeddings)
    submitted: list[str] = []
    real = engine.submit

    def submit(request: Any) -> Any:
        submitted.append(request.request_id)
        return real(request)

    monkeypatch.setattr(engine, "submit", submit)
    too_long = list(range(3, 3 + context))
    body = {"model": "llama", "prompt": [[5, 6, 7], [8, 9], too_long], "max_tokens": 2}
    reply = app.client.post("/v1/completions", json=body, headers=AUTH)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "prompt" and "prompt 2" in reply.text
    body = {"model": "llama", "prompt": [[5, 6, 7], [8, 9]], "max_tokens": context - 2}
    reply = app.client.post("/v1/completions", json=body, headers=AUTH)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "max_tokens"
    assert submitted == []
    assert "cancelled" not in _statuses(app)


def test_a_batch_the_busy_queue_cannot_take_now_is_a_429_with_nothing_queued() -> None:
    settings = SimpleNamespace(max_queued_requests=8, max_queued_tokens=100)
    busy = SimpleNamespace(num_waiting=5, config=None)
    with pytest.raises(Overloaded, match="room for 3 sequences"):
        check_batch_fits(busy, settings, [[1], [2]], 2)
    check_batch_fits(busy, settings, [[1], [2], [3]], 1)  # 3 fit
    check_batch_fits(busy, settings, [[1]], 50)  # one request: the engine's own check
    idle = SimpleNamespace(num_waiting=0, config=None)
    with pytest.raises(Exception, match="max_queued_tokens"):
        check_batch_fits(idle, settings, [[1] * 60, [2] * 60], 1)
