"""`serve` freezes the heap alive after its engines load (gc.freeze), so the cyclic collector's
full passes no longer walk millions of startup objects while holding the GIL: those passes were
what stalled /health during echo + logprobs replies (bench.attacks). Apps built in-process do
not freeze their host's heap."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from runtime.server import create_app
from runtime.server.app import freeze_startup_heap
from runtime.server.wiring import build_state
from tests.fixtures.serve_hooks import serve_after_load
from tests.runtime.server.live import engine_for, light_settings, router_of


def test_freeze_moves_the_live_heap_out_of_the_collectors_generations() -> None:
    assert gc.get_freeze_count() == 0
    try:
        freeze_startup_heap()
        frozen = gc.get_freeze_count()
    finally:
        gc.unfreeze()  # this worker's later tests must get their garbage cycles collected
    assert frozen > 10_000  # a Python with torch imported holds far more


def test_after_load_hooks_run_once_every_engine_has_loaded(
    demo_model_dir: Callable[[str], Path],
) -> None:
    seen: list[bool] = []
    make_router = router_of(llama=partial(engine_for, demo_model_dir("llama"), name="llama"))
    state = build_state(light_settings(), make_router=make_router)
    state.after_load.append(lambda: seen.append(all(e.is_loaded for e in state.engines)))
    with TestClient(create_app(state.settings, state=state)) as client:
        deadline = time.monotonic() + 120
        while not (seen and client.get("/ready").status_code == 200):
            assert state.load_error is None and time.monotonic() < deadline
            time.sleep(0.05)
    assert seen == [True]
    assert gc.get_freeze_count() == 0  # an app built in-process froze nothing of its host


def test_a_failing_after_load_hook_is_logged_and_the_model_still_serves(
    demo_model_dir: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> None:
        raise RuntimeError("hook broke")

    make_router = router_of(llama=partial(engine_for, demo_model_dir("llama"), name="llama"))
    state = build_state(light_settings(), make_router=make_router)
    state.after_load.append(broken)
    with TestClient(create_app(state.settings, state=state)) as client:
        deadline = time.monotonic() + 120
        while "hook broke" not in caplog.text:
            assert time.monotonic() < deadline, "the hook never ran"
            time.sleep(0.05)
        assert client.get("/ready").status_code == 200
    assert state.load_error is None


def test_serve_freezes_the_heap_after_the_load(
    monkeypatch: pytest.MonkeyPatch, demo_model_dir: Callable[[str], Path]
) -> None:
    assert freeze_startup_heap in serve_after_load(monkeypatch, demo_model_dir("llama"))
