"""The status page at `/`: its HTML and scripts (shipped in runtime/server/status/static, no build
step, no CDN), the panel catalogue, the facts beside the series, and a Prometheus-shaped query API.
Every route is a read-only GET; see runtime.server.status.auth for who sees what.

    GET /                        the page (refreshes itself; `?refresh=SECONDS`, default 5)
    GET /status/static/NAME      its scripts and stylesheet
    GET /status/api/panels       the dashboards' panels with their expanded PromQL
    GET /status/api/summary      served versions, memory, alert states, the anomaly audit
    GET /api/v1/query            Prometheus' instant query, over the embedded evaluator's store
    GET /api/v1/query_range      Prometheus' range query, likewise
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from importlib import resources
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from runtime.server.errors import ErrorResponse
from runtime.server.state import ServerState, get_state
from runtime.server.status.auth import Viewer, documented_security, status_viewer
from runtime.server.status.facts import alerts_info, audit_info
from runtime.server.status.page import StatusPage
from runtime.server.status.query import QueryError, parse_step, parse_time
from runtime.server.status.summary import server_info

router = APIRouter(tags=["status"])
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}
STATIC_FILES = ("status.css", "status.js", "panels.js", "facts.js", "charts.js", "format.js")
# the page loads only its own files and talks only to this server
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def attach_status_page(app: FastAPI, state: ServerState) -> None:
    """Mount the page; its catalogue and query service are built from `state` once."""
    app.state.status_page = StatusPage.from_state(state)
    app.include_router(router, dependencies=documented_security(state.settings.api_keys))


def _page(request: Request) -> StatusPage:
    page: StatusPage = request.app.state.status_page
    return page


def _static(name: str) -> Response:
    path = resources.files("runtime.server.status").joinpath("static", name)
    media = STATIC_TYPES[name[name.rindex(".") :]]
    return Response(path.read_bytes(), media_type=media, headers=SECURITY_HEADERS)


def _finite(value: Any) -> Any:
    """JSON has no NaN/Inf: written the way Prometheus writes them, as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _json(content: Any, status_code: int = 200) -> JSONResponse:
    return JSONResponse(_finite(content), status_code=status_code, headers=SECURITY_HEADERS)


@router.get("/", include_in_schema=False)
async def status_page() -> Response:
    return _static("status.html")


@router.get("/status/static/{name}", include_in_schema=False)
async def static_file(name: str) -> Response:
    if name not in STATIC_FILES:  # a fixed list: nothing else under the package is reachable
        raise HTTPException(status_code=404, detail=f"no static file {name!r}")
    return _static(name)


_OBJECT = {"application/json": {"schema": {"type": "object"}}}
_PROM_ERROR = {
    "type": "object",
    "required": ["status", "errorType", "error"],
    "properties": {
        "status": {"type": "string", "enum": ["error"]},
        "errorType": {"type": "string"},
        "error": {"type": "string"},
    },
}
_PROM_SUCCESS = {
    "type": "object",
    "required": ["status", "data"],
    "properties": {"status": {"type": "string", "enum": ["success"]}, "data": {"type": "object"}},
}


def _prom_error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _PROM_ERROR}}}


_VIEWER_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "API keys are configured: missing or invalid key"}
}
_PROM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Prometheus API result",
        "content": {"application/json": {"schema": _PROM_SUCCESS}},
    },
    400: _prom_error("bad_data: bad parameters, or PromQL outside the embedded subset"),
    422: _prom_error(
        "execution: the expression failed on the data, or touched more than query_max_samples "
        "samples, or its answer exceeds query_max_response_bytes"
    ),
    503: _prom_error(
        "timeout: past query_timeout_s; unavailable: the embedded evaluator is off, or "
        "query_max_concurrency queries are already running"
    ),
    **_VIEWER_ERRORS,
}


def _query_params(*names: tuple[str, bool, str]) -> dict[str, Any]:
    """Declared for /openapi.json; parsed by hand so that errors keep Prometheus' shape."""
    return {
        "parameters": [
            {
                "name": n,
                "in": "query",
                "required": r,
                "schema": {"type": "string"},
                "description": d,
            }
            for n, r, d in names
        ]
    }


@router.get(
    "/status/api/panels",
    response_model=None,
    responses={200: {"description": "the page's panels", "content": _OBJECT}, **_VIEWER_ERRORS},
)
async def panels(request: Request, viewer: Viewer = Depends(status_viewer)) -> JSONResponse:
    """Every dashboard panel the page draws, with its expanded PromQL and the page's window."""
    page = _page(request)
    settings = get_state(request).settings
    return _json(
        {
            "window": asdict(page.window),
            "interval_s": page.interval_s,
            "dashboards": [{"name": n, "title": t} for n, t in page.dashboards],
            "panels": [asdict(p) for p in page.panels],
            "store": {"available": page.queries is not None, "reason": page.unavailable},
            "auth": {
                "api_keys": bool(settings.api_keys),
                "admin_configured": bool(settings.admin_token),
                "is_admin": viewer.is_admin,
            },
        }
    )


@router.get(
    "/status/api/summary",
    response_model=None,
    responses={
        200: {"description": "served versions, memory, alerts, audit", "content": _OBJECT},
        **_VIEWER_ERRORS,
    },
)
def summary(request: Request, viewer: Viewer = Depends(status_viewer)) -> JSONResponse:
    """Served versions, memory (owners for the admin), alert states, the anomaly audit."""
    # a plain def: FastAPI runs it in its thread pool (the audit is a SQL query)
    state = get_state(request)
    page = _page(request)
    window_s = page.window.range_s
    return _json(
        {
            "server": asdict(server_info(state, is_admin=viewer.is_admin)),
            "alerts": asdict(alerts_info(state, window_s)),
            "audit": asdict(
                # ?audit=all: every server's rows in the database, not only this one's
                audit_info(
                    state,
                    window_s,
                    is_admin=viewer.is_admin,
                    every_server=request.query_params.get("audit") == "all",
                )
            ),
            "is_admin": viewer.is_admin,
        }
    )


async def _answer(request: Request, run: Any) -> Response:
    """Run `run(queries, params, budget)` on the page's query runner
    (runtime.server.status.query_runner: its own threads, a deadline, bounded samples and bytes)
    and answer its JSON."""
    page = _page(request)
    if page.queries is None or page.runner is None:
        error = QueryError(page.unavailable or "no sample store", "unavailable", 503)
        return _json(error.payload(), error.status)
    queries, params = page.queries, request.query_params
    status, body = await page.runner.answer(lambda budget: run(queries, params, budget))
    return Response(body, status, headers=SECURITY_HEADERS, media_type="application/json")


@router.get(
    "/api/v1/query",
    response_model=None,
    responses=_PROM_RESPONSES,
    openapi_extra=_query_params(
        ("query", True, "PromQL (the embedded subset)"),
        ("time", False, "unix seconds or RFC 3339; default now"),
    ),
)
async def query(request: Request, _viewer: Viewer = Depends(status_viewer)) -> Response:
    """Prometheus' instant query over the embedded evaluator's sample store."""

    def run(queries: Any, params: Any, budget: Any) -> Any:
        at = parse_time(params.get("time"), "time", time.time())
        return queries.instant(params.get("query"), at, budget)

    return await _answer(request, run)


@router.get(
    "/api/v1/query_range",
    response_model=None,
    responses=_PROM_RESPONSES,
    openapi_extra=_query_params(
        ("query", True, "PromQL (the embedded subset)"),
        ("start", True, "unix seconds or RFC 3339"),
        ("end", True, "unix seconds or RFC 3339"),
        ("step", True, "seconds, or a duration such as 15s"),
    ),
)
async def query_range(request: Request, _viewer: Viewer = Depends(status_viewer)) -> Response:
    """Prometheus' range query over the embedded evaluator's sample store."""

    def run(queries: Any, params: Any, budget: Any) -> Any:
        start = parse_time(params.get("start"), "start")
        end = parse_time(params.get("end"), "end")
        step = parse_step(params.get("step"))
        return queries.range(params.get("query"), start, end, step, budget)

    return await _answer(request, run)
