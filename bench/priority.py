"""Priority scheduling under load: the TTFT of high-priority requests that arrive while the engine
is saturated with low-priority ones, against those low-priority ones, FIFO and priority policy
in the same run.

    python -m bench.priority [--quick] [--device cpu|cuda] [--cache-dir DIR]

An in-process engine on the tiny demo llama with its batch pinned at 4 sequences: 24 (quick) or
48 low-priority requests (priority 10, 32 tokens each) are queued at once; once the run is under
way, 4 high-priority ones (priority 0, the same size) arrive one after another, mid-decode: the
i-th when the (4 i)-th low one is half done. Every request reports its own timings
(`report_metrics`: the engine's RequestStats, as `enable_request_metrics` puts them in a
response), so TTFT is admission to first token. The same workload runs under
`scheduling_policy=fcfs`, then `priority`.
Target: under priority, p50 TTFT high / p50 TTFT low <= 0.2, and every request finishes (no
starvation). The FIFO run's ratio is printed beside it for reference.
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

BATCH, TOKENS, PROMPT_TOKENS, NUM_HIGH, EVERY = 4, 32, 16, 4, 4
LOW, HIGH = 10, 0
TARGET_RATIO = 0.2


@dataclass
class Outcome:
    ttft: dict[int, list[float]] = field(default_factory=lambda: {LOW: [], HIGH: []})
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

    # a high one arrives mid-decode (when a low one is half done), not as a slot frees
    halfway = {(i + 1) * EVERY: asyncio.Event() for i in range(NUM_HIGH)}

    async def one(rid: str, priority: int, first: int, index: int = -1) -> None:
        prompt = list(range(first, first + PROMPT_TOKENS))
        request = GenerationRequest(
            rid, prompt, params, report_metrics=True, priority=priority, timeout_s=600
        )
        outcome.num_submitted += 1
        handle = engine.submit(request)
        num_tokens = 0
        async for outputs in handle.batches():
            num_tokens += sum(len(o.token_ids) for o in outputs)
            if index in halfway and num_tokens >= TOKENS // 2:
                halfway[index].set()
        out = await handle.aresult()
        assert isinstance(out.metrics, RequestMetrics) and out.metrics.ttft_seconds is not None
        outcome.ttft[priority].append(out.metrics.ttft_seconds)
        outcome.num_finished += 1

    async def main() -> None:
        tasks.extend(
            asyncio.ensure_future(one(f"low{i}", LOW, 4 + (7 * i) % 380, i)) for i in range(num_low)
        )
        for i, event in enumerate(halfway.values()):
            await event.wait()
            tasks.append(asyncio.ensure_future(one(f"high{i}", HIGH, 420 + 20 * i)))
        await asyncio.gather(*tasks)

    tasks: list[asyncio.Future[None]] = []
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
    num_low = 24 if args.quick else 48
    model = tiny_model(args.cache_dir)
    summary: dict[str, object] = {"bench": "priority", "device": args.device, "quick": args.quick}
    ratios: dict[str, float] = {}
    all_finished = True
    for policy in ("fcfs", "priority"):
        outcome = run(model, args.device, policy, num_low)
        high, low = statistics.median(outcome.ttft[HIGH]), statistics.median(outcome.ttft[LOW])
        ratios[policy] = high / low
        done = outcome.num_finished == outcome.num_submitted == num_low + NUM_HIGH
        all_finished = all_finished and done
        print(
            f"{policy}: p50 TTFT high {high * 1e3:.0f} ms, low {low * 1e3:.0f} ms, "
            f"ratio {ratios[policy]:.3f}; finished {outcome.num_finished}/{outcome.num_submitted}",
            flush=True,
        )
        summary[f"{policy}_ttft_p50_high_s"] = round(high, 4)
        summary[f"{policy}_ttft_p50_low_s"] = round(low, 4)
        summary[f"{policy}_ttft_ratio"] = round(ratios[policy], 4)
    summary["all_finished"] = all_finished
    summary["target_ratio"] = TARGET_RATIO
    summary["meets_targets"] = all_finished and ratios["priority"] <= TARGET_RATIO
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
