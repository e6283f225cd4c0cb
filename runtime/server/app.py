"""`create_app`: the FastAPI application of one server instance.

    app = create_app(load_settings())                 # wires engines, metrics, traces, storage
    app = create_app(settings, state=my_state)        # tests: a prebuilt ServerState (fake engines)

The lifespan starts the wired parts, loads the models in the background (/health answers at once,
/ready and /v1 say 503 until the models are in), and on the way out stops the engines and then
the parts, flushing what they hold.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from runtime.config import Settings, load_settings
from runtime.server.anthropic import routes as anthropic
from runtime.server.anthropic.auth import messages_key_dependencies
from runtime.server.auth import api_key_dependencies
from runtime.server.edge.guard import Guard
from runtime.server.errors import install_error_handlers
from runtime.server.openai import routes as openai
from runtime.server.openai import tokenize
from runtime.server.responses import routes as responses
from runtime.server.rollout import routes as rollout
from runtime.server.rollout.wiring import attach_rollout, attach_rollout_sync
from runtime.server.routes import admin, health, legacy, lora
from runtime.server.state import ServerState
from runtime.server.status.routes import attach_status_page

log = logging.getLogger("fastllm.server")


def create_app(settings: Settings | None = None, *, state: ServerState | None = None) -> FastAPI:
    if state is None:
        from runtime.server.wiring import build_state

        state = build_state(settings or load_settings())
    app = FastAPI(
        title="fastllm",
        summary="OpenAI-compatible inference API",
        version=_version(),
        lifespan=_lifespan,
    )
    app.state.fastllm = state
    install_error_handlers(app)
    app.include_router(openai.router, dependencies=api_key_dependencies(state.settings.api_keys))
    app.include_router(tokenize.router, dependencies=api_key_dependencies(state.settings.api_keys))
    app.include_router(
        anthropic.router, dependencies=messages_key_dependencies(state.settings.api_keys)
    )
    app.include_router(responses.router, dependencies=api_key_dependencies(state.settings.api_keys))
    app.include_router(admin.router)
    app.include_router(lora.router)  # its own auth: the admin token when configured
    app.include_router(rollout.router)
    app.state.rollout = attach_rollout(state)  # canary weights, promotion, automatic rollback
    app.state.rollout_sync = attach_rollout_sync(state, app.state.rollout)  # across replicas
    if state.settings.legacy_support:  # the deprecated POST /predict of older runtimes
        app.include_router(
            legacy.router, dependencies=api_key_dependencies(state.settings.api_keys)
        )
    app.include_router(health.router)
    attach_status_page(app, state)  # GET / and its read-only query API
    app.add_middleware(Guard, state=state)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ServerState = app.state.fastllm
    for start in state.on_start:
        start()
    loading = asyncio.create_task(_load(state))
    try:
        yield
    finally:
        grace = 0.0 if state.drain.is_draining else min(state.settings.drain_grace_s, 5.0)
        await asyncio.to_thread(state.shutdown_engines, grace)
        if not loading.done():
            loading.cancel()
        for stop in reversed(state.on_stop):
            try:
                stop()
            except Exception:  # one part failing to stop must not keep the others running
                log.exception("stopping %r failed", stop)


async def _load(state: ServerState) -> None:
    """Load every engine in a worker thread (the loop keeps answering /health meanwhile)."""
    state.is_loading = True
    try:
        for model, version, engine in state.router.engines():
            started = time.monotonic()
            await asyncio.to_thread(engine.load)
            engine.start()
            log.info("model %s (%s) loaded in %.1fs", model, version, time.monotonic() - started)
    except Exception as exc:  # ModelLoadError and anything a broken checkpoint throws
        state.load_error = f"model failed to load: {exc}"
        log.error("%s", state.load_error)
    finally:
        state.is_loading = False
    if state.load_error is not None:
        return
    for hook in state.after_load:
        try:
            hook()
        except Exception:  # a hook is an optimisation: the loaded engines still serve
            log.exception("after-load hook %r failed", hook)


def freeze_startup_heap() -> None:
    """Move everything alive after the load (modules, the model's wrappers, tokenizers: ~280k
    objects on the demo model) out of the cyclic collector's reach. A full collection walks every
    tracked object with the GIL held (~0.15 s with the startup heap in it) and stalled the event
    loop: /health p99 151-171 ms during echo + logprobs replies, 50-75 ms frozen (bench.attacks).
    `serve` runs it after the load (ServerState.after_load): its engines live as long as the
    process, so what is frozen is what it keeps; a frozen object that did become cyclic garbage
    later would never be collected, a bounded set that exists once. Apps built in-process (tests,
    embedding programs) do not freeze: their host's later garbage cycles must stay collectable."""
    gc.collect()
    gc.freeze()
    log.debug("gc: %d startup objects frozen", gc.get_freeze_count())


def warm_grammar_workers(state: ServerState) -> None:
    """Start every engine's grammar compile workers (in the background: this returns at once).
    Built engines start them at their first constrained request, so a process that never
    compiles never boots their forkserver (~2 s of CPU); `serve` runs this after the load
    (ServerState.after_load), after readiness is decided rather than before, and its first
    constrained request still finds them warm."""
    for engine in state.engines:
        engine.warm_grammars()


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema minus its 422 entries: validation errors are answered as 400 here."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    schema = get_openapi(
        title=app.title, version=app.version, summary=app.summary, routes=app.routes
    )
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            operation.get("responses", {}).pop("422", None)
    components = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    app.openapi_schema = schema
    return schema


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("fastllm-stack")
    except metadata.PackageNotFoundError:
        return "0+unknown"
