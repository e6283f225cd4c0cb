"""Pieces of bench.serving: the workload, the transformers references, the TTFT runs and the
matmul-rate probe."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from runtime.engine.engine import Engine
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.models.config import ModelArgs


@dataclass
class Workload:
    prompts: list[list[int]]
    new_tokens: list[int]


def make_workload(
    n: int,
    *,
    quick: bool,
    seed: int = 0,
    prompt_lens: tuple[int, int] | None = None,
    new_tokens: tuple[int, int] | None = None,
    vocab_size: int = 1000,
) -> Workload:
    """`n` random prompts and new-token counts (both ranges inclusive; the defaults are the
    serving bench's); token ids are drawn from [4, vocab_size) (below 4: special tokens)."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = prompt_lens or ((16, 64) if quick else (32, 256))
    new_lo, new_hi = new_tokens or ((8, 16) if quick else (64, 128))
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    prompts = [torch.randint(4, vocab_size, (k,), generator=g).tolist() for k in lengths]
    return Workload(prompts, torch.randint(new_lo, new_hi + 1, (n,), generator=g).tolist())


def _generate(hf: Any, ids: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    with torch.inference_mode():
        return hf.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=0,
        )


def hf_serial_tokens_per_s(hf: Any, work: Workload, num_requests: int) -> float:
    device = next(hf.parameters()).device
    warm = torch.tensor([work.prompts[0][:8]], device=device)
    _generate(hf, warm, torch.ones_like(warm), 2)  # first calls pick kernels
    start, total = time.perf_counter(), 0
    for prompt, n in list(zip(work.prompts, work.new_tokens, strict=True))[:num_requests]:
        ids = torch.tensor([prompt], device=device)
        _generate(hf, ids, torch.ones_like(ids), n)
        total += n
    return total / (time.perf_counter() - start)


def hf_static_timings(hf: Any, work: Workload) -> dict[str, float]:
    """One left-padded batch of all prompts, generated to the longest request."""
    device = next(hf.parameters()).device
    width = max(len(p) for p in work.prompts)
    ids = torch.zeros((len(work.prompts), width), dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(work.prompts):
        ids[i, width - len(p) :] = torch.tensor(p, device=device)
        mask[i, width - len(p) :] = 1
    start = time.perf_counter()
    _generate(hf, ids, mask, 1)
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    _generate(hf, ids, mask, max(work.new_tokens))
    batch_s = time.perf_counter() - start
    return {
        "tokens_per_s": sum(work.new_tokens) / batch_s,
        "batch_s": batch_s,
        "prefill_s": prefill_s,
    }


def arrivals(n: int, rate: float, seed: int = 1) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    gaps = torch.empty(n).exponential_(generator=g) / rate
    return torch.cumsum(gaps, 0).tolist()


def poisson_engine_run(engine: Engine, work: Workload, rate: float) -> list[str]:
    """Submit at Poisson arrival times, wait for all; the request ids (TTFT is in their stats)."""
    times = arrivals(len(work.prompts), rate)
    start, handles = time.perf_counter(), []
    for i, (t, p, n) in enumerate(zip(times, work.prompts, work.new_tokens, strict=True)):
        time.sleep(max(0.0, start + t - time.perf_counter()))
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        handles.append(engine.submit(GenerationRequest(f"p{i}", p, params)))
    for handle in handles:
        handle.result(timeout=3600)
    return [h.request_id for h in handles]


def simulate_static_ttft(
    work: Workload, rate: float, static: dict[str, float], *, batch: int
) -> float:
    """Static batching on the same arrivals: a free server takes what has arrived (<= batch)."""
    times = arrivals(len(work.prompts), rate)
    ttfts: list[float] = []
    i, free_at = 0, 0.0
    while i < len(times):
        begin = max(free_at, times[i])
        taken = [t for t in times[i : i + batch] if t <= begin]
        ttfts.extend(begin + static["prefill_s"] - t for t in taken)
        i += len(taken)
        free_at = begin + static["batch_s"]
    return statistics.median(ttfts)


def _layer_shapes(args: ModelArgs) -> list[tuple[int, int]]:
    """(in, out) of every linear in one decoder layer."""
    h, q, kv = args.hidden_size, args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    inter = args.intermediate_size
    return [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]


def gemms(args: ModelArgs, tokens: int, sampled: int) -> list[tuple[int, int, int]]:
    """(rows, in, out) of every GEMM of one step: the layers' linears over all `tokens`, the
    lm_head over the `sampled` rows only (the engine computes logits just for those)."""
    layers = [(tokens, i, o) for i, o in _layer_shapes(args)] * args.num_layers
    return [*layers, (sampled, args.hidden_size, args.vocab_size)]


def gemm_flops(shapes: list[tuple[int, int, int]]) -> float:
    return 2.0 * sum(m * i * o for m, i, o in shapes)


def matmul_rate(
    shapes: list[tuple[int, int, int]], device: torch.device, repeats: int = 5
) -> float:
    """FLOP/s of torch fp32 matmuls on exactly these GEMM shapes (best of `repeats`)."""
    pairs = [
        (torch.randn(max(m, 1), i, device=device), torch.randn(i, o, device=device))
        for m, i, o in shapes
    ]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for x, w in pairs:
            torch.mm(x, w)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return gemm_flops([(max(m, 1), i, o) for m, i, o in shapes]) / best


@dataclass(frozen=True)
class StepShape:
    tokens: int  # through the layers
    sampled: int  # rows through the lm_head
    busy_s: float  # the engine's execute() time for the step


@dataclass(frozen=True)
class MatmulIdeal:
    seconds: float  # the steps' GEMMs at the best rate seen for each group (<= the busy time)
    groups: int
    engine_fastest: int  # groups whose best rate was the engine's own step, not torch.mm


def _rate_on_threads(
    shapes: list[tuple[int, int, int]], device: torch.device, threads: int, repeats: int
) -> float:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return matmul_rate(shapes, device, repeats)
    finally:
        torch.set_num_threads(before)


def ideal_matmul_seconds(
    args: ModelArgs,
    steps: list[StepShape],
    device: torch.device,
    *,
    thread_counts: tuple[int, ...] = (1,),
    repeats: int = 3,
) -> MatmulIdeal:
    """How long the GEMMs of these engine steps take at the best rate seen for them in this run.

    The matmul rate depends strongly on the row count (a 1024-token prefill chunk runs near the
    machine's peak, a 32-row decode step well below it), so one rate at a mean shape misjudges
    both. Steps are grouped by the power of two of their token count; each group's FLOPs are
    timed at the group's mean shape with torch.mm on each of `thread_counts` (the engine runs a
    step on one thread or on all, whichever it measured faster: a small GEMM on two OpenMP threads
    can take 100x longer than on one when another process holds a core), and the group's peak is
    the best of those rates and the engine's own rate on that group (its steps run these GEMMs
    and more). So the ideal time is never more than the engine's busy time: fraction_of_matmul_peak
    (ideal / busy) is at most 1, and a group where the engine itself was the fastest counts as at
    peak (`engine_fastest` says how many)."""
    groups: dict[int, list[StepShape]] = {}
    for step in steps:
        groups.setdefault(step.tokens.bit_length(), []).append(step)
    total, engine_fastest = 0.0, 0
    for members in groups.values():
        flops = sum(gemm_flops(gemms(args, m.tokens, m.sampled)) for m in members)
        mean = gemms(
            args,
            round(statistics.fmean(m.tokens for m in members)),
            round(statistics.fmean(m.sampled for m in members)),
        )
        measured = max(_rate_on_threads(mean, device, n, repeats) for n in thread_counts)
        busy = sum(m.busy_s for m in members)
        engine = flops / busy if busy > 0 else 0.0
        engine_fastest += engine > measured
        total += flops / max(measured, engine)
    return MatmulIdeal(total, len(groups), engine_fastest)
