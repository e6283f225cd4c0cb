"""Allocator cost per tier against `torch.empty` + drop, measured in the same run.

    python -m bench.allocator [--quick] [--device cpu|cuda]

Each round times N alloc+release pairs through the allocator and N `torch.empty` + drop pairs of
the same shape, interleaved; the best round of each is kept (these machines are noisy, a minimum
is the least noisy estimate of the cost). On CPU the clock is this thread's CPU time, so other
processes sharing the cores do not inflate either side; on CUDA it is wall time after a sync.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

from runtime.memory import Allocator, AllocatorConfig

TARGET_RATIO = 1.5  # small and medium tiers
SHAPES = {  # float32 elements: 4 KiB, 4 MiB, 32 MiB
    "small": (1024,),
    "medium": (1 << 20,),
    "large": (8 << 20,),
}


def _best_ns(fn: Callable[[int], None], pairs: int, rounds: int, clock: Callable[[], int]) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = clock()
        fn(pairs)
        best = min(best, (clock() - start) / pairs)
    return best


def bench_tier(alloc: Allocator, shape: tuple[int, ...], pairs: int, rounds: int) -> dict:
    device, dtype = alloc.device, torch.float32
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    clock = time.perf_counter_ns if device.type == "cuda" else time.thread_time_ns

    def with_torch(n: int) -> None:
        for _ in range(n):
            t = torch.empty(shape, dtype=dtype, device=device)
            del t
        sync()

    def with_allocator(n: int) -> None:
        for _ in range(n):
            alloc.release(alloc.alloc(shape, dtype, owner="bench"))
        sync()

    with_torch(min(pairs, 100))  # warm both paths (first medium alloc is a miss)
    with_allocator(min(pairs, 100))
    torch_ns = alloc_ns = float("inf")
    for _ in range(rounds):  # interleaved so drift hits both alike
        torch_ns = min(torch_ns, _best_ns(with_torch, pairs, 1, clock))
        alloc_ns = min(alloc_ns, _best_ns(with_allocator, pairs, 1, clock))
    return {
        "ns_per_pair": round(alloc_ns, 1),
        "torch_empty_ns_per_pair": round(torch_ns, 1),
        "ratio_vs_torch_empty": round(alloc_ns / torch_ns, 3),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer pairs and rounds")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    alloc = Allocator(AllocatorConfig(), device=args.device)
    scale = 1 if args.quick else 5
    pairs = {"small": 4000 * scale, "medium": 2000 * scale, "large": 40 * scale}
    rounds = 5 if args.quick else 9
    result: dict = {"bench": "allocator", "device": str(alloc.device), "target_ratio": TARGET_RATIO}
    print(f"{'tier':8} {'allocator ns':>13} {'torch.empty ns':>15} {'ratio':>7}")
    for tier, shape in SHAPES.items():
        r = bench_tier(alloc, shape, pairs[tier], rounds)
        result[tier] = r
        print(
            f"{tier:8} {r['ns_per_pair']:13.0f} {r['torch_empty_ns_per_pair']:15.0f} "
            f"{r['ratio_vs_torch_empty']:7.2f}"
        )
    assert alloc.stats().bytes_in_use == 0, "benchmark left blocks live"
    result["meets_target"] = all(
        result[t]["ratio_vs_torch_empty"] <= TARGET_RATIO for t in ("small", "medium")
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
