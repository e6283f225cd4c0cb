"""The app in-process (no socket): starlette's TestClient runs its lifespan (engines load, the
writer starts) and calls it through ASGI. For the server tests that send many requests: faster
than loopback HTTP and the same app, middleware and engines."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

from runtime.config import Settings
from runtime.engine.stats import FanOut
from runtime.server import create_app
from runtime.server.state import ServerState
from runtime.server.wiring import build_state
from runtime.serving.router import Router
from tests.runtime.server.live import API_KEY, engine_for, light_settings, router_of

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@dataclass
class InProcess:
    client: TestClient
    state: ServerState
    db: Path | None

    def rows(self, expected: int | None = None, timeout_s: float = 30.0) -> int:
        """inference_log request rows. A request's stats reach the writer one engine-loop turn
        after its response, so with `expected` this waits (up to `timeout_s`) for that count."""
        assert self.state.writer is not None and self.db is not None
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.state.writer.flush(timeout_s)
            with sqlite3.connect(self.db) as conn:
                query = "SELECT COUNT(*) FROM inference_log WHERE status != 'probe'"
                (count,) = conn.execute(query).fetchone()
            if expected is None or count == expected or time.monotonic() > deadline:
                return int(count)
            time.sleep(0.02)

    def barrier_rows(self, path: str = "/v1/completions", timeout_s: float = 30.0) -> int:
        """Rows once one more good request's own row is in (the writer keeps order, so every
        earlier request's row is too), counting that one. Waited for by its id, not by a count:
        a row of an earlier test's request may land meanwhile (CI once counted it instead)."""
        assert self.state.writer is not None and self.db is not None
        body = {"model": "llama", "prompt": "barrier", "max_tokens": 1}
        response = self.client.post(path, json=body, headers=AUTH)
        assert response.status_code == 200
        request_id = response.json()["id"]
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.state.writer.flush(timeout_s)
            with sqlite3.connect(self.db) as conn:
                query = "SELECT COUNT(*) FROM inference_log WHERE request_id = ?"
                (mine,) = conn.execute(query, (request_id,)).fetchone()
            if mine:
                return self.rows()
            assert time.monotonic() < deadline, f"the barrier's row {request_id} never came"
            time.sleep(0.02)

    def failures(self, reason: str) -> float:
        return metric_sum(self.state.registry, "fastllm_request_failure_total", reason=reason)


def metric_sum(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return sum(
        s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def storage_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Light settings plus the inference_log on a SQLite file of the test's own."""
    fields: dict[str, Any] = {
        "storage_enabled": True,
        "database_url": f"sqlite:///{tmp_path / 'fastllm.db'}",
        "verify_sample_rate": 0.0,
    }
    fields.update(overrides)
    return light_settings(**fields)


def llama_and_bert(demo_model_dir: Callable[[str], Path]) -> Callable[[FanOut], Router]:
    return router_of(
        llama=partial(engine_for, demo_model_dir("llama"), name="llama"),
        bert=partial(engine_for, demo_model_dir("bert"), name="bert"),
    )


@contextmanager
def in_process(settings: Settings, make_router: Callable[[FanOut], Router]) -> Iterator[InProcess]:
    state = build_state(settings, make_router=make_router)
    db = None
    if settings.storage_enabled and settings.database_url.startswith("sqlite:///"):
        db = Path(settings.database_url.removeprefix("sqlite:///"))
    with TestClient(create_app(settings, state=state), raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 120
        while client.get("/ready").status_code != 200:
            assert state.load_error is None, state.load_error
            assert time.monotonic() < deadline, "the app did not become ready"
            time.sleep(0.05)
        yield InProcess(client, state, db)
