"""Paged KV cache: how many sequences a KV budget holds, and what a cached shared prompt saves.

    python -m bench.kv [--quick] [--device cpu|cuda] [--cache-dir DIR]

1. Peak running sequences at a KV budget that binds (8 x (prompt + max_tokens) tokens), for
   requests with max_tokens=2048 whose client stops them after 64 tokens (prompts of 64): the
   same in-process engine with pages taken as tokens arrive, and with today's reservation policy
   emulated (`kv_reserve_full_sequence`: pages for prompt + max_tokens when first scheduled).
   Model: the tiny demo llama with a 4096-token context (what is counted is pages, not speed).
   Target: paged / reserved >= 8.
2. TTFT with a shared 1,024-token system prompt and a unique 32-token suffix per request:
   `fastllm serve` on the small llama in a subprocess, prefix caching on, then off; requests
   one at a time (max_tokens=1, so a request's latency is its TTFT plus the HTTP round trip,
   the same on both sides), after one warm-up request. The hit rate is read from the caching-on
   server's /metrics. Target: p50 on / p50 off <= 1/4.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx
import torch

from bench.http import DEFAULT_CACHE, ensure_model
from bench.kv_server import hit_rate, serve
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.engine.stats import StepStats
from runtime.models.loader import LoadedModel, load_model

PROMPT_TOKENS, MAX_TOKENS, STOP_AFTER = 64, 2048, 64
SYSTEM_TOKENS, SUFFIX_TOKENS = 1024, 32
TARGETS = {"peak_running_ratio": 8.0, "ttft_p50_ratio": 0.25}


class StepSink:
    def __init__(self) -> None:
        self.steps: list[StepStats] = []

    def record(self, step=None, finished=(), verified=()):  # type: ignore[no-untyped-def]
        if step is not None:
            self.steps.append(step)


def tiny_long_context_model(cache_dir: Path) -> Path:
    path = cache_dir / "llama-tiny-ctx4096-seed0"
    if not (path / "config.json").exists():
        from runtime.models.demo import make_demo_model

        make_demo_model(path, arch="llama", seed=0, overrides={"max_position_embeddings": 4096})
    return path


def peak_running(loaded: LoadedModel, device: str, num_requests: int, *, reserve: bool) -> int:
    """Peak of running sequences over a run of `num_requests` (all submitted at once)."""
    sink = StepSink()
    a = loaded.args
    per_token = a.num_layers * 2 * a.num_kv_heads * a.head_dim * loaded.dtype.itemsize
    budget = (8 * (PROMPT_TOKENS + MAX_TOKENS) + 2 * 16) * per_token  # + the zero page, rounding
    many = 4 * num_requests
    config = EngineConfig(
        model_name="kv",
        device=device,
        max_num_seqs=many,
        min_num_seqs=many,
        initial_num_seqs=many,
        max_num_batched_tokens=8192,
        max_queued_requests=many,
        kv_cache_bytes=budget,
        enable_prefix_caching=False,  # unique prompts: nothing to share; pages are the point
        kv_reserve_full_sequence=reserve,
    )
    engine = Engine(config, sink, loader=lambda: loaded)
    engine.load()
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(4, 500, (PROMPT_TOKENS,), generator=g).tolist() for _ in range(num_requests)
    ]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)

    async def one(i: int) -> None:
        rid = f"{'r' if reserve else 'p'}{i}"
        handle = engine.submit(GenerationRequest(rid, prompts[i], params))
        produced = 0
        async for outputs in handle.batches():
            produced += sum(len(o.token_ids) for o in outputs)
            if produced >= STOP_AFTER:  # the client has what it wanted: stop the request
                engine.cancel(rid)

    async def run_all() -> None:
        await asyncio.gather(*(one(i) for i in range(num_requests)))

    try:
        asyncio.run(run_all())
    finally:
        engine.shutdown()
    return max(s.num_running for s in sink.steps)


def ttft_p50(url: str, model: str, prompts: list[list[int]]) -> float:
    with httpx.Client(base_url=url, timeout=600) as client:
        times = []
        for prompt in prompts:
            body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            t0 = time.perf_counter()
            response = client.post("/v1/completions", json=body)
            times.append(time.perf_counter() - t0)
            response.raise_for_status()
    return statistics.median(times[1:])  # the first is the warm-up (it computes the prefix)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args()
    num_requests, num_ttft = (128, 8) if args.quick else (192, 24)

    tiny = load_model(tiny_long_context_model(args.cache_dir), device=args.device)
    reserved = peak_running(tiny, args.device, num_requests, reserve=True)
    paged = peak_running(tiny, args.device, num_requests, reserve=False)
    print(f"peak running: paged {paged}, reservation emulated {reserved}", flush=True)

    small = ensure_model(None, args.cache_dir)
    g = torch.Generator().manual_seed(1)
    system = torch.randint(4, 32000, (SYSTEM_TOKENS,), generator=g).tolist()
    prompts = [
        system + torch.randint(4, 32000, (SUFFIX_TOKENS,), generator=g).tolist()
        for _ in range(num_ttft + 1)
    ]
    ttft: dict[str, float] = {}
    rate = None
    for caching in (True, False):
        with serve(small, args.device, prefix_caching=caching) as url:
            ttft["on" if caching else "off"] = ttft_p50(url, small.name, prompts)
            if caching:
                rate = hit_rate(httpx.get(f"{url}/metrics").text)
    print(
        f"TTFT p50 (1024-token shared prompt): caching on {ttft['on'] * 1e3:.0f} ms, "
        f"off {ttft['off'] * 1e3:.0f} ms; hit rate {rate:.3f}",
        flush=True,
    )
    summary = {
        "bench": "kv",
        "device": args.device,
        "quick": args.quick,
        "peak_running_paged": paged,
        "peak_running_reserved": reserved,
        "peak_running_ratio": round(paged / max(reserved, 1), 2),
        "ttft_p50_on_s": round(ttft["on"], 4),
        "ttft_p50_off_s": round(ttft["off"], 4),
        "ttft_p50_ratio": round(ttft["on"] / ttft["off"], 4),
        "prefix_cache_hit_rate": round(rate or 0.0, 4),
        "targets": TARGETS,
    }
    summary["meets_targets"] = (
        summary["peak_running_ratio"] >= TARGETS["peak_running_ratio"]
        and summary["ttft_p50_ratio"] <= TARGETS["ttft_p50_ratio"]
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
