"""Issue 39, item 2 re-run: what `/health` and a plain chat see while clients send the heavy
requests that used to run on the event loop.

    python -m bench.event_loop --quick

Starts `fastllm serve` on the random demo llama (or `--url` of a running server), then runs two
phases of the same length: idle (only the probes) and heavy (1 MB-class `/tokenize` calls,
880 KB prompts past the context, `echo` + `logprobs: 20` completions with `n`, a body past
`max_response_bytes`). Prints each phase's /health and plain-chat p50/p99, the heavy / idle
ratios measured in this run, and the heavy requests' status counts (no 5xx expected).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.batching_parts import start_server

_TOKENIZE_PROMPT = "lorem ipsum dolor sit amet " * 36_000  # 972,000 characters
_LONG_PROMPT = "the quick brown fox jumps over the lazy dog " * 20_000  # past any context


def _pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100)[q - 1]


def _heavy_bodies(model: str) -> list[tuple[str, dict[str, Any]]]:
    ids = list(range(3, 503))
    logprobs = {
        "model": model,
        "prompt": [ids] * 4,
        "n": 4,
        "max_tokens": 8,
        "echo": True,
        "logprobs": 20,
    }
    return [
        ("/tokenize", {"model": model, "prompt": _TOKENIZE_PROMPT}),
        ("/v1/completions", {"model": model, "prompt": _LONG_PROMPT, "max_tokens": 1}),
        ("/v1/completions", logprobs),
        ("/v1/completions", {**logprobs, "prompt": [ids] * 8, "n": 16, "max_tokens": 1000}),
    ]


def _phase(
    url: str, model: str, seconds: float, heavy_clients: int, only: int | None = None
) -> dict[str, Any]:
    stop = time.monotonic() + seconds
    health: list[float] = []
    chats: list[float] = []
    statuses: Counter[str] = Counter()
    lock = threading.Lock()

    def pinger() -> None:
        with httpx.Client(timeout=120) as http:
            while time.monotonic() < stop:
                t0 = time.monotonic()
                http.get(f"{url}/health")
                health.append(time.monotonic() - t0)
                time.sleep(0.02)

    def chatter() -> None:
        body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(timeout=120) as http:
            while time.monotonic() < stop:
                t0 = time.monotonic()
                http.post(f"{url}/v1/chat/completions", json=body)
                chats.append(time.monotonic() - t0)
                time.sleep(0.05)

    def heavy(i: int) -> None:
        bodies = _heavy_bodies(model)
        if only is not None:
            bodies = [bodies[only]]
        n = i
        with httpx.Client(timeout=300) as http:
            while time.monotonic() < stop:
                path, body = bodies[n % len(bodies)]
                status = http.post(f"{url}{path}", json=body).status_code
                with lock:
                    statuses[f"{path} {status}"] += 1
                n += 1

    threads = [threading.Thread(target=pinger), threading.Thread(target=chatter)]
    threads += [threading.Thread(target=heavy, args=(i,)) for i in range(heavy_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "health_p50": _pct(health, 50),
        "health_p99": _pct(health, 99),
        "chat_p50": _pct(chats, 50),
        "chat_p99": _pct(chats, 99),
        "statuses": dict(statuses),
    }


def _run(url: str, model: str, seconds: float, clients: int, only: int | None = None) -> None:
    idle = _phase(url, model, seconds, 0)
    hit = _phase(url, model, seconds, clients, only)
    for name, r in (("idle", idle), ("heavy", hit)):
        print(
            f"{name:5s} /health p50 {r['health_p50'] * 1e3:7.1f} ms  p99 "
            f"{r['health_p99'] * 1e3:7.1f} ms   chat p50 {r['chat_p50'] * 1e3:7.1f} ms  p99 "
            f"{r['chat_p99'] * 1e3:7.1f} ms"
        )
    print(f"heavy requests: {hit['statuses']}")
    print(
        f"heavy / idle: /health p50 x{hit['health_p50'] / idle['health_p50']:.2f}, "
        f"p99 x{hit['health_p99'] / idle['health_p99']:.2f}; chat p50 "
        f"x{hit['chat_p50'] / idle['chat_p50']:.2f}, p99 x{hit['chat_p99'] / idle['chat_p99']:.2f}"
    )
    fives = sum(v for k, v in hit["statuses"].items() if k.split()[-1].startswith("5"))
    print(f"5xx under load: {fives}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--model", default="llama", help="the model name (with --url)")
    parser.add_argument("--seconds", type=float, default=30.0, help="per phase")
    parser.add_argument("--clients", type=int, default=8, help="heavy clients")
    parser.add_argument("--only", type=int, default=None, help="one heavy body (its index)")
    parser.add_argument("--quick", action="store_true", help="8 s phases, 6 heavy clients")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.clients = 8.0, 6
    if args.url is not None:
        _run(args.url, args.model, args.seconds, args.clients, args.only)
        return
    from runtime.models.demo import make_demo_model

    with tempfile.TemporaryDirectory() as tmp:
        model = make_demo_model(Path(tmp) / "llama", arch="llama")
        server = start_server(str(model), "cpu", {})
        try:
            name = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
            _run(server.url, name, args.seconds, args.clients, args.only)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
