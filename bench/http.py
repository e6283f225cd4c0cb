"""What the HTTP server costs on top of the engine: one workload, two paths, same run.

    python -m bench.http [--quick] [--model DIR] [--device cpu|cuda] [--cache-dir DIR]

The model is the `small` llama (hidden 512, 8 layers, random weights), the benchmark model of the
foundation issue, built under --cache-dir when absent; --model points at another checkpoint (e.g.
the 2-layer demo llama, where a token costs the engine ~0.3 ms on CPU and the server's per-token
work is a large share of it). The workload is C concurrent streams (C = 32 and 64), each a greedy
completion of the same prompt with a fixed max_tokens, so both paths produce identical tokens.
Path "engine": an in-process Engine, each stream an `async for` over its RequestHandle. Path
"http": `fastllm serve` in a subprocess (telemetry, storage and alerts off: the server alone is
measured), each stream an SSE request from a lean asyncio-streams client. Rounds alternate
between the paths and the best round of each is kept (the least noisy estimate on a shared
machine).

    server_overhead_pct = (http wall time per token / engine wall time per token - 1) * 100

The last line is one JSON object; the target is <= 10% per concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.batching_parts import free_port, wait_ready
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams

TARGET_PCT = 10.0
USAGE = re.compile(rb'"completion_tokens":(\d+)')
DEFAULT_CACHE = Path(os.environ.get("FASTLLM_BENCH_CACHE", "/tmp/fastllm-bench"))
PROMPT = "The quick brown fox jumps over the lazy dog and then"


def engine_config(model: Path, device: str) -> EngineConfig:
    """The default batch policy on both paths (the adaptive controller, as `fastllm serve`)."""
    return EngineConfig(model_path=model, model_name=model.name, device=device)


async def engine_round(engine: Engine, prompt_ids: list[int], streams: int, tokens: int) -> tuple:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)

    async def one(i: int) -> int:
        handle = engine.submit(
            GenerationRequest(f"bench-{time.monotonic_ns()}-{i}", prompt_ids, params)
        )
        count = 0
        async for out in handle:
            count += len(out.token_ids)
        return count

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(streams)))
    return time.perf_counter() - start, sum(counts)


async def http_round(url: str, model: str, streams: int, tokens: int) -> tuple:
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Connection: close\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload

    async def one() -> int:
        # A lean client on asyncio streams, the counterpart of the engine path's `async for`: it
        # reads every byte as it comes but decodes only the final usage event. (httpx's per-chunk
        # machinery costs as much CPU as the server's side of a token, and the client shares the
        # machine's cores with the server, so it would be billed to the server.)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"server answered {head.splitlines()[0]!r}")
            tail = b""
            while data := await reader.read(65536):
                tail = (tail + data)[-4096:]
        finally:
            writer.close()
        found = USAGE.findall(tail)  # the include_usage chunk is the last with a usage
        return int(found[-1]) if found else 0

    start = time.perf_counter()
    counts = await asyncio.gather(*(one() for _ in range(streams)))
    return time.perf_counter() - start, sum(counts)


def start_server(model: Path, device: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {
        **os.environ,
        "FASTLLM_DEVICE": device,
        "FASTLLM_METRICS_ENABLED": "false",
        "FASTLLM_TRACING_ENABLED": "false",
        "FASTLLM_STORAGE_ENABLED": "false",
        "FASTLLM_ALERTS_ENABLED": "false",
    }
    cmd = [
        sys.executable,
        "-m",
        "runtime",
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, 300.0)
    return proc, url


def ensure_model(path: str | None, cache_dir: Path) -> Path:
    if path:
        return Path(path)
    default = cache_dir / "llama-small-seed0"  # the same checkpoint bench.serving uses
    if not (default / "config.json").exists():
        from runtime.models.demo import make_demo_model

        print(f"building the small llama under {default}", file=sys.stderr)
        make_demo_model(default, arch="llama", size="small", seed=0, progress=True)
    return default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and rounds")
    parser.add_argument("--model", default=None, help="checkpoint dir (default: the small llama)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args()
    tokens, rounds = (16, 3) if args.quick else (64, 5)
    model = ensure_model(args.model, args.cache_dir)
    concurrencies = (32, 64)
    engine = Engine(engine_config(model, args.device))
    policy = engine.config.batch_policy
    print(
        f"policy: defaults (band {policy.min_util}-{policy.max_util}, limit "
        f"{policy.min_batch}..{policy.max_batch} from {policy.initial}) on both paths",
        flush=True,
    )
    engine.load()
    engine.start()
    prompt_ids = engine.tokenizer.encode(PROMPT)
    proc, url = start_server(model, args.device)
    results: dict[str, dict[str, float]] = {}
    try:
        asyncio.run(engine_round(engine, prompt_ids, 8, 4))  # warm both paths up
        asyncio.run(http_round(url, model.name, 8, 4))
        for streams in concurrencies:
            best = {"engine": float("inf"), "http": float("inf")}
            for _ in range(rounds):
                for path in ("engine", "http"):
                    if path == "engine":
                        wall, n = asyncio.run(engine_round(engine, prompt_ids, streams, tokens))
                    else:
                        wall, n = asyncio.run(http_round(url, model.name, streams, tokens))
                    assert n == streams * tokens, f"{path}: {n} tokens, expected {streams * tokens}"
                    best[path] = min(best[path], wall / n)
            pct = (best["http"] / best["engine"] - 1.0) * 100.0
            results[str(streams)] = {
                "engine_ms_per_token": round(best["engine"] * 1e3, 4),
                "http_ms_per_token": round(best["http"] * 1e3, 4),
                "server_overhead_pct": round(pct, 2),
            }
            print(
                f"{streams} streams: engine {best['engine'] * 1e3:.3f} ms/token, "
                f"http {best['http'] * 1e3:.3f} ms/token, overhead {pct:+.1f}%",
                flush=True,
            )
    finally:
        proc.terminate()
        proc.wait(60)
        engine.shutdown(0.0)
    summary = {
        "bench": "http",
        "model": model.name,
        "device": args.device,
        "max_tokens": tokens,
        "policy": "defaults",
        "server_overhead_pct": {k: v["server_overhead_pct"] for k, v in results.items()},
        "details": results,
        "target_pct": TARGET_PCT,
        "meets_target": all(v["server_overhead_pct"] <= TARGET_PCT for v in results.values()),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
