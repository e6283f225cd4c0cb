"""Priority scheduling under load: the TTFT of a high-priority request against a low-priority one
sent at the same moment, while the engine is saturated with low-priority work; FIFO and priority
policy in the same run.

    python -m bench.priority [--quick] [--device cpu|cuda] [--cache-dir DIR]

An in-process engine on the tiny demo llama with its batch pinned at 4 sequences: 32 (quick) or
64 low-priority requests (priority 10, 32 tokens each) are queued at once. Four times during the
run (when low request 0, 4, 8, 12 is three quarters done: mid-decode, not as a slot frees) a pair
arrives together: a high-priority request (priority 0) and a low-priority probe (priority 10),
the same size. Every request reports its own timings (`report_metrics`: the engine's
RequestStats, as `enable_request_metrics` puts them in a response), so TTFT is admission to
first token. Each run first warms its engine up with one batch. The same workload runs under
`scheduling_policy=fcfs`, then `priority`.
Target: under priority, p50 TTFT of the high ones / p50 TTFT of their probes <= 0.2, and every
request finishes (no starvation). Under fcfs the same ratio reads about 1 (the reference).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from bench.http import DEFAULT_CACHE
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.engine.timings import RequestMetrics

BATCH, TOKENS, PROMPT_TOKENS = 4, 32, 16
ARRIVALS = (0, 4, 8, 12)  # a pair arrives when each of these low requests is 3/4 done
LOW, HIGH = 10, 0
TARGET_RATIO = 0.2


@dataclass
class Outcome:
    # TTFT seconds by kind: "high", "probe" (low, sent with a high one), "bulk" (queued at start)
    ttft: dict[str, list[float]] = field(
        default_factory=lambda: {"high": [], "probe": [], "bulk": []}
    )
    num_finished: int = 0
    num_submitted: int = 0


def tiny_model(cache_dir: Path) -> Path:
    path = cache_dir / "llama-tiny-seed0"
    if not (path / "config.json").exists():
        from runtime.models.demo import make_demo_model

        make_demo_model(path, arch="llama", seed=0)
    return path


def run(model: Path, device: str, policy: str, num_low: int) -> Outcome:
    config = EngineConfig(
        model_path=model,
        model_name="priority",
        device=device,
        num_threads=1,
        max_num_seqs=BATCH,
        min_num_seqs=BATCH,
        initial_num_seqs=BATCH,
        batch_warmup=False,
        scheduling_policy=policy,
        priority_aging_s=0.0,  # the run is short: aging would only blur the comparison
    )
    engine = Engine(config)
    engine.load()
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
    outcome = Outcome()
    arrivals = {i: asyncio.Event() for i in ARRIVALS}

    async def one(rid: str, kind: str, first: int, index: int = -1) -> None:
        prompt = list(range(first, first + PROMPT_TOKENS))
        priority = HIGH if kind == "high" else LOW
        request = GenerationRequest(
            rid, prompt, params, report_metrics=True, priority=priority, timeout_s=600
        )
        handle = engine.submit(request)
        if kind == "warm-up":
            await handle.aresult()
            return
        outcome.num_submitted += 1
        num_tokens = 0
        async for outputs in handle.batches():
            num_tokens += sum(len(o.token_ids) for o in outputs)
            if index in arrivals and num_tokens >= TOKENS * 3 // 4:
                arrivals[index].set()
        out = await handle.aresult()
        assert isinstance(out.metrics, RequestMetrics) and out.metrics.ttft_seconds is not None
        outcome.ttft[kind].append(out.metrics.ttft_seconds)
        outcome.num_finished += 1

    async def main() -> None:
        await asyncio.gather(*(one(f"warm{i}", "warm-up", 300 + i) for i in range(BATCH)))
        tasks = [
            asyncio.ensure_future(one(f"low{i}", "bulk", 4 + (7 * i) % 380, i))
            for i in range(num_low)
        ]
        for k, event in enumerate(arrivals.values()):
            await event.wait()
            tasks.append(asyncio.ensure_future(one(f"high{k}", "high", 420 + 20 * k)))
            tasks.append(asyncio.ensure_future(one(f"probe{k}", "probe", 430 + 20 * k)))
        await asyncio.gather(*tasks)

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer low-priority requests")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args()
    num_low = 32 if args.quick else 64
    model = tiny_model(args.cache_dir)
    summary: dict[str, object] = {"bench": "priority", "device": args.device, "quick": args.quick}
    ratios: dict[str, float] = {}
    all_finished = True
    expected = num_low + 2 * len(ARRIVALS)
    for policy in ("fcfs", "priority"):
        outcome = run(model, args.device, policy, num_low)
        p50 = {kind: statistics.median(times) for kind, times in outcome.ttft.items()}
        ratios[policy] = p50["high"] / p50["probe"]
        all_finished = all_finished and outcome.num_finished == outcome.num_submitted == expected
        print(
            f"{policy}: p50 TTFT high {p50['high'] * 1e3:.0f} ms, low sent with it "
            f"{p50['probe'] * 1e3:.0f} ms (ratio {ratios[policy]:.3f}), low queued at start "
            f"{p50['bulk'] * 1e3:.0f} ms; finished {outcome.num_finished}/{outcome.num_submitted}",
            flush=True,
        )
        for kind, seconds in p50.items():
            summary[f"{policy}_ttft_p50_{kind}_s"] = round(seconds, 4)
        summary[f"{policy}_ttft_ratio"] = round(ratios[policy], 4)
    summary["all_finished"] = all_finished
    summary["target_ratio"] = TARGET_RATIO
    summary["meets_targets"] = all_finished and ratios["priority"] <= TARGET_RATIO
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
