"""LoRA hot load/unload under load, the issue's figure at full size, against a live server.

    python -m bench.lora_hot_swap [--quick] [--streams 16] [--cycles 50] [--cache-dir DIR]

`fastllm serve` (a subprocess: the tiny demo llama, prefix caching on) serves 4 PEFT adapters
(rank 16, random A and B on all seven projections, large enough that each changes the greedy
tokens). Every prompt shares a long prefix, so a KV page shared across adapters would show.
1. Alone: each model (the base and the 4 adapters) serves its prompt by itself, one request at
   a time: the reference text of every later answer.
2. Under load: --streams streams send completions over the adapters and the base while the
   adapter `hot` is loaded (from one of the 4 directories in turn), queried and unloaded
   --cycles times (bench.lora_swap_load).
Figures: requests ok / failed, 5xx answers, cycles, answers (and streams) whose text differs
from serving alone, prompt tokens a fresh `hot` found cached (must be 0), the allocator's bytes
in use (/admin/memory) before and after against the baseline, and the adapters' loads and
evictions. --quick: 8 streams, 10 cycles (`make bench`). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from bench.kv_server import serve
from bench.lora import DEFAULT_CACHE, ensure_model, write_adapter
from bench.lora_swap_load import SwapPlan, run_swap_load
from runtime.models.loader import read_args

ADMIN_TOKEN = "bench-hot-swap"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}  # no API keys: the admin token as Bearer
SERVED, ADAPTERS = "bench", ("a0", "a1", "a2", "a3")
SHARED_TOKENS, MAX_TOKENS = 48, 6


def allocator_bytes(url: str) -> int:
    memory = httpx.get(f"{url}/admin/memory", headers=ADMIN, timeout=60).json()
    return int(sum(a["bytes_in_use"] for a in memory["allocators"]))


def lora_counts(url: str) -> dict[str, int]:
    memory = httpx.get(f"{url}/admin/memory", headers=ADMIN, timeout=60).json()
    rows = memory["loras"]
    return {k: sum(int(r[k]) for r in rows) for k in ("loads_total", "evictions_total")}


def alone(url: str, prompts: dict[str, list[int]]) -> dict[str, str]:
    """Each model's text for its prompt, served by itself."""
    texts = {}
    with httpx.Client(base_url=f"{url}/v1", timeout=120) as client:
        for model, prompt in prompts.items():
            body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                    "temperature": 0, "ignore_eos": True}  # fmt: skip
            response = client.post("/completions", json=body)
            response.raise_for_status()
            texts[model] = response.json()["choices"][0]["text"]
    return texts


def settled_bytes(url: str, baseline: int, wait_s: float = 10.0) -> int:
    """Bytes in use once the last finished sequences have let go (polled briefly: a request's
    answer can reach the client a moment before its sequence is closed)."""
    deadline = time.monotonic() + wait_s
    while (now := allocator_bytes(url)) != baseline and time.monotonic() < deadline:
        time.sleep(0.2)
    return now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--streams", type=int, default=None)
    parser.add_argument("--cycles", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args()
    plan = SwapPlan(
        streams=args.streams or (8 if args.quick else 16),
        cycles=args.cycles or (10 if args.quick else 50),
        max_tokens=MAX_TOKENS,
    )
    model_dir = ensure_model(None, args.cache_dir, quick=True)  # the tiny demo llama
    model_args = read_args(model_dir)
    root = args.cache_dir / f"lora-hot-swap-{model_dir.name}"
    dirs = {
        n: write_adapter(model_args, root / n, 16, seed=i, std=0.3) for i, n in enumerate(ADAPTERS)
    }
    g = torch.Generator().manual_seed(2)
    shared = torch.randint(3, model_args.vocab_size, (SHARED_TOKENS,), generator=g).tolist()
    prompts = {m: [*shared, 10 + i, 20 + i] for i, m in enumerate((SERVED, *ADAPTERS))}
    env = {
        "FASTLLM_LORAS": ",".join(f"{n}={p}" for n, p in dirs.items()),
        "FASTLLM_MAX_LORAS": str(len(ADAPTERS) + 1),  # the streams' 4 and `hot`
        "FASTLLM_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    with serve(model_dir, args.device, prefix_caching=True, name=SERVED, env=env) as url:
        expected = alone(url, prompts)
        baseline = allocator_bytes(url)
        before = lora_counts(url)
        start = time.perf_counter()
        hot_sources = [(n, str(dirs[n])) for n in ADAPTERS]
        result = run_swap_load(url, plan, prompts, expected, hot_sources, None, ADMIN)
        wall = time.perf_counter() - start
        after = settled_bytes(url, baseline)
        counts = lora_counts(url)
    distinct = len(set(expected.values()))
    figures: dict[str, Any] = {
        "model": model_dir.name,
        "streams": plan.streams,
        "adapters": len(ADAPTERS),
        "cycles": result.cycles,
        "requests_ok": result.requests_ok,
        "requests_failed": result.requests_failed,
        "status_5xx": result.status_5xx,
        "stream_requests": result.stream_requests,
        "mismatched_requests": result.mismatched_requests,
        "mismatched_streams": len(result.mismatched_streams),
        "hot_mismatched": result.hot_mismatched,
        "hot_cached_tokens": result.hot_cached_tokens,
        "distinct_alone_texts": distinct,  # of 5 (base + 4): the token check can tell them apart
        "allocator_bytes_baseline": baseline,
        "allocator_bytes_after": after,
        "allocator_bytes_back": after == baseline,
        "hot_adapter_bytes": result.hot_bytes,
        "lora_loads": counts["loads_total"] - before["loads_total"],
        "lora_evictions": counts["evictions_total"] - before["evictions_total"],
        "wall_s": round(wall, 2),
    }
    print(
        f"{plan.streams} streams over {len(ADAPTERS)} adapters + base, {result.cycles} load/unload "
        f"cycles of `hot` ({result.hot_bytes} bytes): {result.requests_ok} calls ok "
        f"({result.stream_requests} stream completions), {result.requests_failed} failed, "
        f"{result.status_5xx} 5xx; {len(result.mismatched_streams)} streams and "
        f"{result.hot_mismatched} hot answers differ from serving alone ({distinct}/5 distinct "
        f"alone texts); cached tokens of a fresh hot "
        f"{result.hot_cached_tokens}; allocator {after} bytes after vs {baseline} baseline"
    )
    for problem in result.problems:
        print(f"  {problem}", file=sys.stderr)
    print(json.dumps(figures))
    if not result.clean or after != baseline:
        sys.exit(1)


if __name__ == "__main__":
    main()
