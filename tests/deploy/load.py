"""Client load through the proxy: a few threads, each with its own keep-alive httpx client, sending
requests back to back and recording when each started, when it ended and whether it succeeded."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx

from tests.deploy.replicas import MODEL


@dataclass(frozen=True)
class Outcome:
    started: float  # time.monotonic() when the request was sent
    ended: float
    ok: bool  # 200 and, for a stream, the closing `data: [DONE]`
    detail: str  # status code or the exception, for the failure message


def one_request(client: httpx.Client, url: str, *, max_tokens: int, stream: bool) -> Outcome:
    body = {
        "model": MODEL,
        "prompt": "the proxy",
        "max_tokens": max_tokens,
        "ignore_eos": True,  # every request runs to max_tokens: a predictable length
        "stream": stream,
    }
    started = time.monotonic()
    try:
        if stream:
            with client.stream("POST", f"{url}/v1/completions", json=body) as response:
                lines = [line for line in response.iter_lines() if line.startswith("data: ")]
            ok = response.status_code == 200 and lines[-1:] == ["data: [DONE]"]
            detail = f"{response.status_code}, {len(lines)} events"
        else:
            response = client.post(f"{url}/v1/completions", json=body)
            ok, detail = (
                response.status_code == 200,
                f"{response.status_code} {response.text[:200]}",
            )
    except httpx.HTTPError as exc:
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    return Outcome(started, time.monotonic(), ok, detail)


class Load:
    """`with Load(url, threads=3, ...) as load:` keeps `threads` requests in flight until exit."""

    def __init__(self, url: str, *, threads: int, max_tokens: int, stream: bool = False) -> None:
        self.url = url
        self.max_tokens = max_tokens
        self.stream = stream
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                outcome = one_request(
                    client, self.url, max_tokens=self.max_tokens, stream=self.stream
                )
                with self._lock:
                    self.outcomes.append(outcome)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(90)

    def completed_since(self, since: float) -> int:
        with self._lock:
            return sum(1 for o in self.outcomes if o.started >= since)

    def wait_completed(self, count: int, since: float = 0.0, timeout_s: float = 60.0) -> None:
        """Until `count` requests that started after `since` have ended."""
        deadline = time.monotonic() + timeout_s
        while self.completed_since(since) < count:
            assert time.monotonic() < deadline, f"load stalled: {self.outcomes[-5:]}"
            time.sleep(0.02)
