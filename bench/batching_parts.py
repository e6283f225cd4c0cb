"""Pieces of bench.batching: a `fastllm serve` subprocess with a given batch policy, closed-loop
and open-loop (Poisson) SSE load on lean asyncio streams, and a /metrics scraper: the limit, u
and busy traces, and the windows' throughput, TPOT and TTFT from the server's own series. Pure
helpers (`histogram_quantile`, `window_stats`, `settle_stats`) are tested in tests/bench/."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

PROMPT_TOKENS = 40
NEW_TOKENS = 64
TRACED = {
    "fastllm_batch_size_limit": "limit",
    "fastllm_device_utilization_ratio": "u",
    "fastllm_device_busy_ratio": "busy",
}


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    policy: dict[str, str]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(
    proc: subprocess.Popen[bytes], url: str, timeout_s: float, path: str = "/ready"
) -> None:
    """Poll `url + path` until it answers 200; the process exiting first, or the time running
    out (the process is then killed), raises RuntimeError."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}{path}", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"{url} did not become ready within {timeout_s:.0f} s")


def start_server(
    model: str, device: str, policy: dict[str, str], ready_timeout_s: float = 300.0
) -> Server:
    """`fastllm serve` with the FASTLLM_* batch settings in `policy` (empty: the defaults);
    metrics on (the traces come from /metrics), tracing, storage and alerts off unless `policy`
    sets them."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTLLM_")}
    env.update(
        FASTLLM_DEVICE=device,
        FASTLLM_TRACING_ENABLED="false",
        FASTLLM_STORAGE_ENABLED="false",
        FASTLLM_ALERTS_ENABLED="false",
        FASTLLM_VERIFY_SAMPLE_RATE="0",
        FASTLLM_DRAIN_GRACE_S="1",
        MALLOC_ARENA_MAX=os.environ.get("MALLOC_ARENA_MAX", "2"),  # as bench.soak's children
    )
    env.update(policy)  # a policy may also turn one of the above back on
    cmd = [sys.executable, "-m", "runtime", "serve", "--model", model, "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, ready_timeout_s)
    return Server(proc, url, policy)


def _request_bytes(url: str, model: str, prompt: list[int]) -> bytes:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    payload = json.dumps(body).encode()
    host = url.removeprefix("http://")
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nConnection: close\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def one_request(url: str, model: str, prompt: list[int]) -> None:
    """One streamed completion, read to its end. (Timings come from the server's own metrics:
    the random-weight model's tokens often decode to no text, so SSE events do not mark tokens.)"""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(_request_bytes(url, model, prompt))
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"server answered {status!r}")
        while await reader.read(65536):
            pass
    finally:
        writer.close()


def random_prompt(rng: random.Random) -> list[int]:
    return [rng.randrange(4, 1000) for _ in range(PROMPT_TOKENS)]


async def closed_loop(url: str, model: str, streams: int, seconds: float) -> None:
    """`streams` clients, each sending its next request when the last one ends; at `seconds`
    every request still in flight is cancelled (its connection closed: the server frees it)."""

    async def client(k: int) -> None:
        rng = random.Random(k)
        while True:
            await one_request(url, model, random_prompt(rng))

    tasks = [asyncio.ensure_future(client(k)) for k in range(streams)]
    await asyncio.sleep(seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def open_loop(url: str, model: str, rate: float, seconds: float) -> int:
    """Poisson arrivals at `rate` requests/s for `seconds`, whatever the server's pace; waits
    for every request to end. Returns the number sent."""
    rng = random.Random(7)
    start, t, tasks = time.perf_counter(), 0.0, []
    while (t := t + rng.expovariate(rate)) < seconds:
        await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
        tasks.append(asyncio.ensure_future(one_request(url, model, random_prompt(rng))))
    await asyncio.gather(*tasks)
    return len(tasks)


@dataclass
class Scrape:
    """One /metrics scrape: the traced gauges and the cumulative series the windows use."""

    t: float
    gauges: dict[str, float] = field(default_factory=dict)  # limit, u, busy
    num_steps: float = 0.0  # fastllm_batch_size_count: engine steps
    num_seq_steps: float = 0.0  # fastllm_batch_size_sum: sequences x steps = tokens stepped
    tpot: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    ttft: dict[float, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, t: float, text: str) -> Scrape:
        out = cls(t)
        for family in text_string_to_metric_families(text):
            if family.name in TRACED and family.samples:
                out.gauges[TRACED[family.name]] = max(s.value for s in family.samples)
            for sample in family.samples:
                if sample.name == "fastllm_batch_size_count":
                    out.num_steps += sample.value
                elif sample.name == "fastllm_batch_size_sum":
                    out.num_seq_steps += sample.value
                elif sample.name.endswith("_bucket") and family.name in HISTOGRAMS:
                    into = getattr(out, HISTOGRAMS[family.name])
                    le = float(sample.labels["le"])
                    into[le] = into.get(le, 0.0) + sample.value
        return out


HISTOGRAMS = {
    "fastllm_time_per_output_token_seconds": "tpot",
    "fastllm_time_to_first_token_seconds": "ttft",
}


async def scrape_loop(url: str, stop: asyncio.Event, scrapes: list[Scrape]) -> None:
    """Every second until `stop`, and once more after it."""
    async with httpx.AsyncClient(timeout=30) as client:
        while True:
            text = (await client.get(f"{url}/metrics")).text
            scrapes.append(Scrape.parse(time.perf_counter(), text))
            if stop.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


def histogram_quantile(q: float, before: dict[float, float], after: dict[float, float]):
    """Prometheus' histogram_quantile over the increase between two scrapes (linear inside a
    bucket; None when nothing was observed)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank, lower, below = q * counts[-1], 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return None


def window_stats(scrapes: Sequence[Scrape], t0: float, t1: float) -> dict[str, float | None]:
    """From the scrapes inside [t0, t1]: tokens stepped per second (each sequence in a step gets
    a token; 40-token prompts are never chunked), the mean step interval (a stream's time per
    output token in steady state), and TPOT / TTFT p50 of the requests finished in between."""
    inside = [s for s in scrapes if t0 <= s.t <= t1]
    if len(inside) < 2:
        return {"tokens_per_s": None, "step_interval_s": None, "tpot_p50_s": None}
    first, last = inside[0], inside[-1]
    span, steps = last.t - first.t, last.num_steps - first.num_steps
    tpot = histogram_quantile(0.5, first.tpot, last.tpot)
    ttft = histogram_quantile(0.5, first.ttft, last.ttft)
    return {
        "tokens_per_s": round((last.num_seq_steps - first.num_seq_steps) / span, 1),
        "step_interval_s": round(span / steps, 4) if steps else None,
        "tpot_p50_s": None if tpot is None else round(tpot, 4),
        "ttft_p50_s": None if ttft is None else round(ttft, 4),
    }


def trace_of(scrapes: Sequence[Scrape], t0: float) -> list[dict[str, float]]:
    return [
        {"t": round(s.t - t0, 2), **{k: round(v, 3) for k, v in s.gauges.items()}} for s in scrapes
    ]


def settle_stats(trace: Sequence[dict[str, float]], interval_s: float) -> dict[str, float | None]:
    """From a limit/u trace of one run (trace_of): the steady state is its second half.
    settle_intervals: control intervals from the start until the limit stays within the
    steady state's range; limit_changes_per_min in the steady state; the median u there."""
    points = [p for p in trace if "limit" in p]
    if len(points) < 4:
        return {"settle_intervals": None, "limit_changes_per_min": None, "utilization": None}
    t_start, t_end = points[0]["t"], points[-1]["t"]
    half = [p for p in points if p["t"] >= (t_start + t_end) / 2]
    lo, hi = min(p["limit"] for p in half), max(p["limit"] for p in half)
    settled_at = t_start
    for p in points:
        if not lo <= p["limit"] <= hi:
            settled_at = p["t"]
    changes = sum(1 for a, b in itertools.pairwise(half) if a["limit"] != b["limit"])
    minutes = max(half[-1]["t"] - half[0]["t"], 1e-9) / 60
    us = [p["u"] for p in half if "u" in p and p["u"] == p["u"]]  # NaN: no reading
    return {
        "settle_intervals": round((settled_at - t_start) / interval_s, 1),
        "limit_changes_per_min": round(changes / minutes, 2),
        "utilization": round(statistics.median(us), 3) if us else None,
    }
