"""Connection deadlines and sizes, below the ASGI app where the app cannot see them: uvicorn's
HTTP protocol (httptools) with four bounds, each refusal counted in
`fastllm_http_connections_closed_total{reason}` (and the open ones in
`fastllm_http_connections_open`):

- `header_too_large`: a request's head (request line and headers) longer than `max_header_bytes`
  is answered 431 and the connection closed (before, a 16 MB header was read into memory);
- `header_timeout`: a request head not complete within `header_read_timeout_s` of its first byte,
  or of the connection's opening, closes the connection (408 when some bytes came): an idle
  connection that never sends, or one trickling its headers a byte at a time, holds a file
  descriptor for that long at most;
- `keep_alive_timeout`: no next request within `keep_alive_timeout_s` of a response (uvicorn's own
  `timeout_keep_alive`, counted here);
- `max_connections`: a connection beyond `max_connections` open at once is answered 503 with
  Retry-After and closed at once.

The request body has its own deadline and size (`body_read_timeout_s`, `max_body_bytes`:
runtime.server.edge.body).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from runtime.server.errors import error_payload

CLOSE_REASONS = ("header_too_large", "header_timeout", "keep_alive_timeout", "max_connections")


@dataclass(frozen=True)
class ConnectionLimits:
    max_header_bytes: int = 32 << 10
    header_read_timeout_s: float = 10.0
    keep_alive_timeout_s: float = 5.0
    max_connections: int = 512

    @classmethod
    def from_settings(cls, settings: Any) -> ConnectionLimits:
        return cls(
            settings.max_header_bytes,
            settings.header_read_timeout_s,
            settings.keep_alive_timeout_s,
            settings.max_connections,
        )


@dataclass(frozen=True)
class ConnectionMetrics:
    open: Gauge
    closed: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ConnectionMetrics:
        closed = Counter(
            "fastllm_http_connections_closed_total",
            "HTTP connections the server closed on a bound: header_too_large (431), "
            "header_timeout, keep_alive_timeout, max_connections (503).",
            ["reason"],
            registry=registry,
        )
        for reason in CLOSE_REASONS:
            closed.labels(reason)
        open_ = Gauge(
            "fastllm_http_connections_open", "HTTP connections open now.", registry=registry
        )
        return cls(open_, closed)


def _response(status: int, phrase: str, message: str, code: str, extra: bytes = b"") -> bytes:
    error_type = "service_unavailable" if status >= 500 else "invalid_request_error"
    body = json.dumps(error_payload(message, error_type, code=code)).encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n%s\r\n" % (status, phrase.encode(), len(body), extra)
    ) + body


def bounded_protocol(limits: ConnectionLimits, metrics: ConnectionMetrics) -> type[Any]:
    """uvicorn's httptools protocol with the four bounds (pass it as `uvicorn.Config(http=...)`,
    with `timeout_keep_alive=limits.keep_alive_timeout_s`)."""

    class BoundedHttpProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            metrics.open.inc()
            self._head_done = False  # the current request's head is complete
            self._head_bytes = 0  # bytes received since the current request began
            self._head_timer: asyncio.TimerHandle | None = None
            if len(self.connections) > limits.max_connections:
                message = f"more than max_connections={limits.max_connections} open; retry later"
                retry = b"retry-after: 1\r\n"
                self._close("max_connections", 503, "Service Unavailable", message, retry)
                return
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            metrics.open.dec()
            self._disarm_head_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if not self._head_done:
                self._head_bytes += len(data)
                if self._head_timer is None:  # a next request on a kept-alive connection
                    self._arm_head_timer()
            super().data_received(data)
            if not self._head_done and self._head_bytes > limits.max_header_bytes:
                message = f"request headers larger than max_header_bytes={limits.max_header_bytes}"
                self._close("header_too_large", 431, "Request Header Fields Too Large", message)

        def on_headers_complete(self) -> None:
            self._head_done = True
            self._disarm_head_timer()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            if not self.pipeline:  # else the next request's head is already in
                self._head_done, self._head_bytes = False, 0  # keep-alive timer runs meanwhile
            super().on_response_complete()

        def timeout_keep_alive_handler(self) -> None:
            if not self.transport.is_closing():
                metrics.closed.labels("keep_alive_timeout").inc()
            super().timeout_keep_alive_handler()

        def _arm_head_timer(self) -> None:
            self._head_timer = self.loop.call_later(
                limits.header_read_timeout_s, self._head_timed_out
            )

        def _disarm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            in_request = self.cycle is not None and not self.cycle.response_complete
            if self._head_done or in_request or self.transport.is_closing():
                return  # a (pipelined) request is being served: the body deadline's business
            if self._head_bytes == 0:  # never sent a byte: nothing to answer
                metrics.closed.labels("header_timeout").inc()
                self.transport.close()
                return
            message = (
                f"request headers not received within "
                f"header_read_timeout_s={limits.header_read_timeout_s:g}"
            )
            self._close("header_timeout", 408, "Request Timeout", message)

        def _close(
            self, reason: str, status: int, phrase: str, message: str, extra: bytes = b""
        ) -> None:
            if self.transport.is_closing():
                return
            metrics.closed.labels(reason).inc()
            self._disarm_head_timer()
            self.transport.write(_response(status, phrase, message, reason, extra))
            self.transport.close()

    return BoundedHttpProtocol


def server_options(limits: ConnectionLimits, registry: CollectorRegistry) -> dict[str, Any]:
    """uvicorn.Config keyword arguments that apply `limits`, counted on `registry`."""
    protocol = bounded_protocol(limits, ConnectionMetrics.create(registry))
    return {"http": protocol, "timeout_keep_alive": limits.keep_alive_timeout_s}
