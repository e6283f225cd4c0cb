"""Graceful drain: on SIGTERM withdraw readiness (/ready 503) while still serving for
`unready_s`, so a load balancer's health check takes the replica out first; then stop admitting
(503 + Retry-After), let in-flight requests finish within the grace period, then stop the engines
and let uvicorn exit with status 0.

uvicorn's own SIGTERM handling closes the listener at once (new clients get connection refused,
not a 503) and re-raises the signal after shutdown (exit status -15), so `DrainingServer` takes
the first SIGTERM / SIGINT itself; a second SIGINT still forces the exit.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry

from runtime.server.edge.connections import ConnectionLimits, server_options

log = logging.getLogger("fastllm.server")


class Drain:
    """In-flight API requests and the draining flag. Only the event loop thread touches it."""

    def __init__(self) -> None:
        self.is_leaving = False  # readiness withdrawn (SIGTERM seen); new requests still served
        self.is_draining = False  # new requests refused
        self.num_in_flight = 0  # /v1 requests between arrival and their last byte sent

    def enter(self) -> None:
        self.num_in_flight += 1

    def exit(self) -> None:
        self.num_in_flight -= 1

    async def wait_idle(self, timeout_s: float) -> bool:
        """True when nothing is in flight any more, False when `timeout_s` ran out first."""
        deadline = time.monotonic() + timeout_s
        while self.num_in_flight > 0:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True


async def drain(app: Any, grace_s: float, unready_s: float = 0.0) -> None:
    """Answer /ready 503 but keep serving for `unready_s` (the load balancer's time to notice),
    then refuse new requests, wait for in-flight ones up to `grace_s`, then stop the engines
    (which fail whatever is still running after the rest of the grace, and free its memory)."""
    state = app.state.fastllm
    state.drain.is_leaving = True
    if unready_s > 0:
        log.info("leaving: /ready answers 503, still serving for %.1fs", unready_s)
        await asyncio.sleep(unready_s)
    state.drain.is_draining = True
    started = time.monotonic()
    log.info("draining: %d request(s) in flight, grace %.1fs", state.drain.num_in_flight, grace_s)
    is_idle = await state.drain.wait_idle(grace_s)
    if not is_idle:
        log.warning("drain grace ran out with %d request(s) in flight", state.drain.num_in_flight)
    remaining_s = max(0.0, grace_s - (time.monotonic() - started))
    await asyncio.to_thread(state.shutdown_engines, remaining_s)
    await state.drain.wait_idle(1.0)  # let the failed streams send their last bytes


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, *, grace_s: float, unready_s: float = 0.0) -> None:
        super().__init__(config)
        self.grace_s = grace_s
        self.unready_s = unready_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self.on_drained: Callable[[], None] | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_task is None and not self.should_exit and self._loop is not None:
            log.info("received %s: draining", signal.Signals(sig).name)
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        if sig == signal.SIGINT:  # a second Ctrl+C: stop waiting
            self.force_exit = True
        self.should_exit = True

    def _start_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await drain(self.config.app, self.grace_s, self.unready_s)
        finally:
            self.should_exit = True


def run_server(
    app: Any,
    *,
    host: str,
    port: int,
    grace_s: float,
    unready_s: float = 0.0,
    log_level: str = "info",
    access_log: bool = True,
    limits: ConnectionLimits | None = None,
) -> int:
    """Serve `app` until SIGTERM / SIGINT has drained it; returns the process exit status.
    `limits`: header size and deadlines, keep-alive, open connections
    (runtime.server.edge.connections; default: its defaults), counted on the app's registry."""
    state = getattr(app.state, "fastllm", None)
    registry = state.registry if state is not None else CollectorRegistry()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=5,
        lifespan="on",
        **server_options(limits or ConnectionLimits(), registry),
    )
    if access_log:  # after uvicorn.Config, which (re)configures its loggers
        from runtime.server import access_log as quiet_status

        quiet_status.install()  # the status page's polling stays out of the access log
    server = DrainingServer(config, grace_s=grace_s, unready_s=unready_s)
    server.run()
    return 0 if server.started else 1
