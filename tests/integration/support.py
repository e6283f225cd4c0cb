"""Helpers for the integration tests: a fully wired runtime (the real `build_state`, the same
wiring `fastllm serve` uses) on loopback, and a steady client load against it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from runtime.config import Settings
from runtime.server.wiring import build_state
from tests.runtime.server.live import LiveServer

MODEL = "llama"  # the served name: the demo checkpoint's directory name


def runtime_settings(model_dir: Path, **overrides: Any) -> Settings:
    """CPU, the tiny demo llama, no verification; each test switches on what it proves."""
    fields: dict[str, Any] = {
        "model_path": model_dir,
        "model_name": MODEL,
        "device": "cpu",
        "verify_sample_rate": 0.0,
        "storage_enabled": False,
        "alerts_enabled": False,
        "drain_grace_s": 5.0,
    }
    fields.update(overrides)
    return Settings(**fields)


@contextmanager
def live_runtime(settings: Settings) -> Iterator[LiveServer]:
    """The app exactly as wiring builds it from `settings`, served on 127.0.0.1:<free port>."""
    server = LiveServer(build_state(settings))
    try:
        yield server.start()
    finally:
        server.stop()


class SteadyLoad:
    """`num_clients` threads each sending short completions until `stop()`: back to back, or at
    most one per `interval_s` each (the rest of the interval waited on the stop event, not spun),
    so a test that needs a steady flow of requests, not as many as the CPU allows, pays for no
    more than it needs."""

    def __init__(
        self, url: str, *, num_clients: int = 2, max_tokens: int = 8, interval_s: float = 0.0
    ) -> None:
        self.url = f"{url}/v1/completions"
        self.interval_s = interval_s
        self.body = {"model": MODEL, "prompt": "the quick brown fox", "max_tokens": max_tokens}
        self.num_ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._client, daemon=True) for _ in range(num_clients)
        ]

    def start(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def _client(self) -> None:
        with httpx.Client(timeout=60.0) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                response = client.post(self.url, json=self.body)
                with self._lock:
                    if response.status_code == 200:
                        self.num_ok += 1
                    else:
                        self.failures.append(f"{response.status_code} {response.text[:200]}")
                self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - sent)))

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
