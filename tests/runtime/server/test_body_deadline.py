"""Finding 4 of issue 17 at the ASGI level: a body that stalls is answered (408 at its deadline,
503 as soon as the drain starts) with the connection closed, and is never counted in flight, so
the drain does not wait for it. The guard runs here over a scripted `receive`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.config import Settings
from runtime.engine.stats import FanOut, RequestStats
from runtime.server.edge.guard import Guard
from runtime.server.lifecycle import Drain
from tests.runtime.server.live import API_KEY, light_settings


class Finished:
    def __init__(self) -> None:
        self.requests: list[RequestStats] = []

    def record(self, step: Any = None, finished: Sequence[RequestStats] = (), verified: Any = ()):
        self.requests.extend(finished)


@dataclass
class EdgeState:
    """What the guard reads of a ServerState."""

    settings: Settings
    stats: FanOut
    drain: Drain = field(default_factory=Drain)
    load_error: str | None = None
    is_ready: bool = True


def scope(content_length: int) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": [
            (b"authorization", f"Bearer {API_KEY}".encode()),
            (b"content-length", str(content_length).encode()),
        ],
    }


async def call(state: EdgeState, chunks: list[bytes], *, stall: bool) -> tuple[list[Any], Any]:
    """Run the guard: `chunks` arrive (more_body until the last unless `stall`), then nothing."""
    sent: list[Any] = []
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        seen["body"], seen["in_flight"] = message["body"], state.drain.num_in_flight
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    queue = list(chunks)

    async def receive() -> dict[str, Any]:
        if queue:
            body = queue.pop(0)
            return {"type": "http.request", "body": body, "more_body": stall or bool(queue)}
        await asyncio.Event().wait()  # a client that sends nothing more
        raise AssertionError("unreachable")

    async def send(message: Any) -> None:
        sent.append(message)

    size = sum(map(len, chunks)) + (1000 if stall else 0)
    await asyncio.wait_for(Guard(app, state)(scope(size), receive, send), 60)
    return sent, seen


def status_and_headers(sent: list[Any]) -> tuple[int, dict[bytes, bytes], dict[str, Any]]:
    start, body = sent
    return start["status"], dict(start["headers"]), json.loads(body["body"])


def test_a_stalled_body_times_out_with_408_and_a_closed_connection() -> None:
    sink = Finished()
    state = EdgeState(light_settings(body_read_timeout_s=0.3), FanOut([sink]))
    sent, seen = asyncio.run(call(state, [b'{"model": "llama", '], stall=True))
    status, headers, payload = status_and_headers(sent)
    assert (status, headers[b"connection"]) == (408, b"close")
    assert payload["error"]["code"] == "body_timeout" and "body_read_timeout_s" in str(payload)
    assert seen == {} and state.drain.num_in_flight == 0  # never reached the app
    assert [r.failure_reason for r in sink.requests] == ["validation"]


def test_the_drain_answers_a_stalled_body_at_once() -> None:
    sink = Finished()
    state = EdgeState(light_settings(body_read_timeout_s=600), FanOut([sink]))

    async def drain_soon() -> tuple[list[Any], Any]:
        guard = asyncio.ensure_future(call(state, [b"{"], stall=True))
        await asyncio.sleep(0.3)  # the guard is waiting for the rest of the body
        assert not guard.done() and state.drain.num_in_flight == 0  # not in flight...
        state.drain.is_draining = True  # ...so the drain sees nothing to wait for
        return await guard

    sent, seen = asyncio.run(drain_soon())
    status, headers, payload = status_and_headers(sent)
    assert (status, headers[b"connection"], headers[b"retry-after"]) == (503, b"close", b"5")
    assert seen == {} and payload["error"]["type"] == "service_unavailable"
    assert [r.failure_reason for r in sink.requests] == ["overloaded"]


def test_a_body_in_pieces_reaches_the_app_counted_in_flight() -> None:
    state = EdgeState(light_settings(body_read_timeout_s=5), FanOut())
    pieces = [b'{"model": "llama", ', b'"prompt": "hi"}']
    sent, seen = asyncio.run(call(state, pieces, stall=False))
    assert sent[0]["status"] == 200
    assert seen == {"body": b"".join(pieces), "in_flight": 1}
    assert state.drain.num_in_flight == 0
