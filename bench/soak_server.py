"""`bench.soak --server`: generation through `fastllm serve` under a long mixed load.

The engine-level soak (bench.soak_run) drives the Engine directly; this one goes through the
whole server on its defaults (metrics on; tracing, storage and alerts off), so the HTTP layer,
streaming, client disconnects and the prefix cache are all in the loop. From 8 concurrent
clients, N requests to /v1/completions with token-id prompts (fixed seed):

- mixed lengths: prompts of 8-512 tokens, 1-64 new tokens (greedy, `ignore_eos`);
- prefix hits: 30% of the prompts start with one of 4 shared 256-token prefixes;
- streaming and not: half the requests stream;
- cancellations: 10% of the requests stream and the client hangs up after the first chunk.

The server's RSS is sampled every `interval` finished requests (the first 10% are warm-up); after
the drain /metrics gives the KV pages still held, the allocator bytes in use (the KV pool's one
block among them) and the idle self-check's leaked pages and orphan blocks. `--model` takes any
checkpoint `fastllm serve` loads (default: the `small` random llama, built once).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from bench.batching_parts import start_server
from bench.soak_run import WARMUP_FRACTION, fluctuation_pct, growth_pct

CONCURRENCY = 8
PROMPT_LENS = (8, 512)
NEW_TOKENS = (1, 64)
PREFIX_LEN = 256
NUM_PREFIXES = 4
PREFIX_SHARE = 0.3
STREAM_SHARE = 0.5
CANCEL_SHARE = 0.1


@dataclass(frozen=True)
class ServerSoakFigures:
    requests: int  # requests finished (cancelled ones included)
    rss_fluctuation_pct: float
    rss_growth_pct: float
    rss_mean_mib: float
    failed_requests: int  # a non-200 answer or a broken stream (cancellations are not failures)
    cancelled_requests: int
    streamed_requests: int
    prefix_hit_tokens: int  # from /metrics after the run
    kv_pages_held_after_drain: int
    allocator_in_use_bytes_after_drain: int  # the KV pool is one block, reserved at load
    kv_leaked_pages_after_drain: int  # the idle self-check's gauges (-1: not exported)
    allocator_orphan_blocks_after_drain: int
    seconds: float


@dataclass(frozen=True)
class Draw:
    prompt: list[int]
    max_tokens: int
    stream: bool
    cancel: bool


def draw(rng: random.Random, prefixes: list[list[int]], vocab: int) -> Draw:
    lo, hi = PROMPT_LENS
    if rng.random() < PREFIX_SHARE:
        tail = [rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi - PREFIX_LEN))]
        prompt = rng.choice(prefixes) + tail
    else:
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))]
    cancel = rng.random() < CANCEL_SHARE
    stream = cancel or rng.random() < STREAM_SHARE
    return Draw(prompt, rng.randint(*NEW_TOKENS), stream, cancel)


async def _one(http: httpx.AsyncClient, url: str, model: str, d: Draw) -> bool:
    """One request; True when it went as intended (a cancelled one counts as fine)."""
    body = {
        "model": model,
        "prompt": d.prompt,
        "max_tokens": d.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": d.stream,
    }
    if not d.stream:
        response = await http.post(f"{url}/v1/completions", json=body)
        return response.status_code == 200 and bool(response.json()["choices"])
    async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            return False
        done = False
        async for line in response.aiter_lines():
            if d.cancel and line.startswith("data:"):
                return True  # hang up after the first chunk: the server must free the sequence
            done = done or line.strip() == "data: [DONE]"
        return done


def scrape(url: str) -> dict[str, float]:
    """The after-drain figures from /metrics, summed over label sets."""
    wanted = {
        "fastllm_kv_cache_pages": ("state", "used"),
        "fastllm_allocator_bytes": ("state", "in_use"),
        "fastllm_prefix_cache_hits_total": None,
        "fastllm_kv_leaked_pages": None,
        "fastllm_allocator_orphan_blocks": None,
    }
    out = dict.fromkeys(wanted, 0.0)
    out["fastllm_kv_leaked_pages"] = out["fastllm_allocator_orphan_blocks"] = -1.0
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name if s.name in wanted else family.name
            if name not in wanted or s.name.endswith("_created"):
                continue
            label = wanted[name]
            if label is None or s.labels.get(label[0]) == label[1]:
                out[name] = max(out[name], 0.0) + s.value
    return out


async def _drive(
    url: str, model: str, n: int, interval: int, vocab: int, pid: int, stop_at: float
) -> dict:
    process = psutil.Process(pid)
    rng0 = random.Random(0)
    prefixes = [[rng0.randrange(3, vocab) for _ in range(PREFIX_LEN)] for _ in range(NUM_PREFIXES)]
    samples: list[tuple[int, int]] = []
    state = {"next": 0, "done": 0, "failed": 0, "cancelled": 0, "streamed": 0}

    async def client(k: int, http: httpx.AsyncClient) -> None:
        rng = random.Random(1000 + k)
        while state["next"] < n and time.monotonic() < stop_at:
            state["next"] += 1
            d = draw(rng, prefixes, vocab)
            try:
                ok = await _one(http, url, model, d)
            except httpx.HTTPError:
                ok = False
            state["failed"] += not ok
            state["cancelled"] += d.cancel
            state["streamed"] += d.stream
            state["done"] += 1
            if state["done"] % interval == 0:
                samples.append((state["done"], process.memory_info().rss))
                print(
                    f"soak: {state['done']} requests, server RSS {samples[-1][1] / 2**20:.1f} MiB,"
                    f" failed {state['failed']}",
                    file=sys.stderr,
                    flush=True,
                )

    async with httpx.AsyncClient(timeout=300) as http:
        await asyncio.gather(*(client(k, http) for k in range(CONCURRENCY)))
    return {"samples": samples, **state}


def _vocab_size(model: Path) -> int:
    return int(json.loads((model / "config.json").read_text())["vocab_size"])


def run_server_soak(
    model: Path,
    num_requests: int,
    interval: int,
    device: str = "cpu",
    max_seconds: float = float("inf"),
    settings: dict[str, str] | None = None,
) -> dict:
    """`max_seconds`: no request is started after that long from the call (a soak on a shared
    machine that must end by a deadline); the figures then cover the requests finished.
    `settings`: FASTLLM_* variables for the server (empty: its defaults)."""
    print(f"policy: server defaults {settings or ''}", file=sys.stderr, flush=True)
    stop_at = time.monotonic() + max_seconds  # the model's load counts too
    # a loaded shared machine can take minutes to load and warm the model up
    server = start_server(str(model), device, settings or {}, ready_timeout_s=1800.0)
    start = time.perf_counter()
    try:
        models = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
        name = models[0]["id"]
        vocab, pid = _vocab_size(model), server.proc.pid
        run = asyncio.run(_drive(server.url, name, num_requests, interval, vocab, pid, stop_at))
        time.sleep(3.0)  # cancelled sequences reaped; the engine idle long enough to self-check
        after = scrape(server.url)
    finally:
        server.stop()
    samples = run["samples"]
    kept = [rss for done, rss in samples if done > run["done"] * WARMUP_FRACTION]
    if len(kept) < 2:
        raise ValueError(f"need >= 2 samples after warm-up, got {len(kept)}")
    figures = ServerSoakFigures(
        requests=run["done"],
        rss_fluctuation_pct=round(fluctuation_pct(kept), 3),
        rss_growth_pct=round(growth_pct(kept), 3),
        rss_mean_mib=round(sum(kept) / len(kept) / 2**20, 1),
        failed_requests=run["failed"],
        cancelled_requests=run["cancelled"],
        streamed_requests=run["streamed"],
        prefix_hit_tokens=int(after["fastllm_prefix_cache_hits_total"]),
        kv_pages_held_after_drain=int(after["fastllm_kv_cache_pages"]),
        allocator_in_use_bytes_after_drain=int(after["fastllm_allocator_bytes"]),
        kv_leaked_pages_after_drain=int(after["fastllm_kv_leaked_pages"]),
        allocator_orphan_blocks_after_drain=int(after["fastllm_allocator_orphan_blocks"]),
        seconds=round(time.perf_counter() - start, 1),
    )
    return {"figures": asdict(figures), "samples": samples}
