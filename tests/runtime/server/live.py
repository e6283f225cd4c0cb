"""A live server on loopback for the server tests: uvicorn in a thread on a socket bound to port 0
(no free-port race), stopped when the test ends."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from runtime.config import Settings
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.stats import FanOut
from runtime.models.loader import LoadedModel
from runtime.server import create_app
from runtime.server.state import ServerState
from runtime.server.wiring import build_state
from runtime.serving.router import Router

API_KEY = "sk-test-key"
ADMIN_TOKEN = "admin-test-token"


def light_settings(**overrides: Any) -> Settings:
    """No database, no alert evaluator; metrics and traces on (they are in-process and cheap)."""
    fields: dict[str, Any] = {
        "device": "cpu",
        "storage_enabled": False,
        "alerts_enabled": False,
        "api_keys": [API_KEY],
        "admin_token": ADMIN_TOKEN,
        "max_num_seqs": 32,
        "drain_grace_s": 5.0,
    }
    fields.update(overrides)
    return Settings(**fields)


def engine_for(
    path: Path,
    sink: FanOut,
    *,
    name: str,
    loader: Callable[[], LoadedModel] | None = None,
    **config: Any,
) -> Engine:
    """One intra-op thread unless a test asks for more (tests/conftest.py: the workers share two
    cores). It also keeps a server's floats bit-for-bit repeatable: with more, the first steps of
    each size class alternate between thread counts (runtime.engine.threads.StepThreads), and a
    reduction split another way changes the last bits of a logprob. `loader`: a model already
    loaded (engines may share one: runtime.models.fast.build builds its fast path once)."""
    fields: dict[str, Any] = {
        "model_path": path,
        "model_name": name,
        "device": "cpu",
        "num_threads": 1,
    }
    fields.update(config)
    return Engine(EngineConfig(**fields), sink=sink, loader=loader)


def router_of(**engines: Callable[[FanOut], Engine]) -> Callable[[FanOut], Router]:
    def make(sink: FanOut) -> Router:
        router = Router()
        for name, factory in engines.items():
            router.add(name, stable=factory(sink))
        return router

    return make


def bound_socket() -> socket.socket:
    """A loopback socket on a port of its own (its URL is known before the server is built)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def url_of(sock: socket.socket) -> str:
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


class LiveServer:
    def __init__(self, state: ServerState, sock: socket.socket | None = None) -> None:
        self.state = state
        self.app = create_app(state.settings, state=state)
        self.sock = sock or bound_socket()
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, wait_ready: bool = True, timeout_s: float = 120.0) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            assert self.thread.is_alive(), "uvicorn thread died during startup"
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        if wait_ready:
            self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        # one client for every probe (tests/fixtures/ready.wait_ready says why)
        with httpx.Client() as client:
            while client.get(f"{self.url}/ready").status_code != 200:
                assert self.state.load_error is None, self.state.load_error
                assert time.monotonic() < deadline, "server did not become ready"
                time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


@contextmanager
def live_server(
    settings: Settings,
    make_router: Callable[[FanOut], Router],
    *,
    wait_ready: bool = True,
    sock: socket.socket | None = None,
) -> Iterator[LiveServer]:
    server = LiveServer(build_state(settings, make_router=make_router), sock)
    try:
        yield server.start(wait_ready=wait_ready)
    finally:
        server.stop()
