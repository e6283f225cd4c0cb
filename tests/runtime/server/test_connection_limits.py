"""Issue 29's connection findings against the real CLI (`fastllm serve`): connections that never
send a byte, or trickle their headers, are closed by the header deadline; an oversized header is a
431; past `max_connections` a new connection gets a 503; an idle kept-alive connection is closed;
each counted in `fastllm_http_connections_closed_total{reason}`. Every wait below is bounded by a
deadline (the server's setting plus a margin); none asserts how fast anything was."""

from __future__ import annotations

import contextlib
import os
import re
import select
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.ready import fastllm_command, start_on_free_port

HEADER_TIMEOUT_S = 2.0
KEEP_ALIVE_S = 1.0
MAX_HEADER_BYTES = 8192
MAX_CONNECTIONS = 40
MARGIN_S = 20.0  # far above a deadline that works; far below "never"
NUM_IDLE = 20


@pytest.fixture(scope="module")
def port(
    demo_model_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    env = {
        **os.environ,
        "FASTLLM_STORAGE_ENABLED": "false",
        "FASTLLM_ALERTS_ENABLED": "false",
        "FASTLLM_TRACING_ENABLED": "false",
        "FASTLLM_DEVICE": "cpu",
        "FASTLLM_DRAIN_GRACE_S": "2",
        "FASTLLM_HEADER_READ_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "FASTLLM_KEEP_ALIVE_TIMEOUT_S": str(KEEP_ALIVE_S),
        "FASTLLM_MAX_HEADER_BYTES": str(MAX_HEADER_BYTES),
        "FASTLLM_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    }
    model = str(demo_model_dir("llama"))
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    proc, port = start_on_free_port(
        lambda p: [*fastllm_command(), "serve", "--model", model, "--port", str(p)],
        log_path,
        env=env,
    )
    try:
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log_path.read_text(errors="replace")


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=HEADER_TIMEOUT_S + MARGIN_S)


def _until_closed(sock: socket.socket) -> bytes:
    """What the server sent before closing; socket.timeout if it never closes within the
    socket's timeout (the finding)."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def _closed_count(port: int, reason: str) -> float | None:
    """The counter's value; None while the server has no such counter."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    found = re.search(rf'fastllm_http_connections_closed_total\{{reason="{reason}"\}} (\S+)', text)
    return float(found.group(1)) if found else None


def _counted(port: int, reason: str, before: float | None) -> float:
    """How many more closes the counter has than `before` (asserting that it exists)."""
    after = _closed_count(port, reason)
    assert after is not None, f"no fastllm_http_connections_closed_total{{reason={reason!r}}}"
    return after - (before or 0.0)


def test_connections_that_send_nothing_are_closed_by_the_header_deadline(port: int) -> None:
    before = _closed_count(port, "header_timeout")
    idle = [_connect(port) for _ in range(NUM_IDLE)]
    try:
        answers = [_until_closed(sock) for sock in idle]
    finally:
        for sock in idle:
            sock.close()
    assert answers == [b""] * NUM_IDLE  # closed without a word: there was no request
    assert _counted(port, "header_timeout", before) >= NUM_IDLE


def test_trickled_headers_are_closed_by_the_header_deadline(port: int) -> None:
    before = _closed_count(port, "header_timeout")
    sock = _connect(port)
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 4000
    deadline = time.monotonic() + HEADER_TIMEOUT_S + MARGIN_S
    answer, is_closed = b"", False
    try:
        for i in range(len(head)):  # a byte every 50 ms: the head is never complete
            if time.monotonic() > deadline:
                break
            try:
                sock.sendall(head[i : i + 1])
            except (BrokenPipeError, ConnectionResetError):
                is_closed = True
                break
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable:  # the server spoke (its 408) or closed
                answer, is_closed = _until_closed(sock), True
                break
    finally:
        sock.close()
    assert is_closed
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert _counted(port, "header_timeout", before) >= 1


def test_an_oversized_header_is_a_431(port: int) -> None:
    before = _closed_count(port, "header_too_large")
    sock = _connect(port)
    try:
        # the server may close while we are still sending: its answer is read below
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(
                b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
            )
        answer = _until_closed(sock)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"max_header_bytes" in answer
    assert _counted(port, "header_too_large", before) == 1


def test_past_max_connections_a_new_connection_gets_a_503(port: int) -> None:
    before = _closed_count(port, "max_connections")
    held = [_connect(port) for _ in range(MAX_CONNECTIONS + 5)]
    try:
        extra = _until_closed(held[-1])  # the newest: over the cap
        assert extra.startswith(b"HTTP/1.1 503 "), extra[:200]
        assert b"max_connections" in extra
    finally:
        for sock in held:
            sock.close()
    assert _counted(port, "max_connections", before) >= 1


def test_an_idle_kept_alive_connection_is_closed(port: int) -> None:
    before = _closed_count(port, "keep_alive_timeout")
    sock = _connect(port)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = _until_closed(sock)  # the response, then the close after KEEP_ALIVE_S
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert _counted(port, "keep_alive_timeout", before) == 1
