"""The status page's polling stays out of the access log (issue 39: one open page wrote ~130
lines every 10 s). Checked on uvicorn's own access-log records: a real uvicorn server, the
filter installed as `run_server` installs it."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from runtime.server import access_log


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _app() -> FastAPI:
    app = FastAPI()
    for path in ("/", "/v1/models", "/status/api/summary", "/api/v1/query", "/api/v1/query_range"):
        app.add_api_route(path, lambda: {"ok": True}, methods=["GET"])
    return app


@pytest.fixture
def server() -> Iterator[tuple[str, Lines]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(_app(), host="127.0.0.1", port=port, access_log=True, log_level="info")
    logger = logging.getLogger(access_log.ACCESS_LOGGER)
    before = list(logger.filters)
    access_log.install()
    lines = Lines()
    logger.addHandler(lines)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", lines
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        logger.removeHandler(lines)
        logger.filters[:] = before


def test_status_page_polling_is_not_logged(server: tuple[str, Lines]) -> None:
    url, lines = server
    with httpx.Client(base_url=url, timeout=10) as client:
        for path in ("/status/api/summary", "/api/v1/query?query=up", "/api/v1/query_range"):
            assert client.get(path).status_code == 200
        assert client.get("/status/api/nothing").status_code == 404  # errors stay
        assert client.get("/v1/models").status_code == 200
        assert client.get("/").status_code == 200
    deadline = time.monotonic() + 5
    while len(lines.messages) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    paths = [m.split('"')[1].split(" ")[1] for m in lines.messages]
    assert paths == ["/status/api/nothing", "/v1/models", "/"], lines.messages


def test_install_adds_one_filter() -> None:
    logger = logging.getLogger("test.access_log")
    first = access_log.install(logger)
    assert access_log.install(logger) is first and logger.filters == [first]
    record = logging.LogRecord("x", logging.INFO, "", 0, "plain %s", ("arg",), None)
    assert first.filter(record)  # another shape of record: let through
