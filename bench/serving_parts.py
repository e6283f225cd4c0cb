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


def ideal_matmul_seconds(
    args: ModelArgs, steps: list[tuple[int, int]], device: torch.device, repeats: int = 3
) -> float:
    """How long torch's fp32 matmuls take on the GEMMs of these engine steps, each step at its own
    shapes: `steps` is (tokens through the layers, rows through the lm_head) per step.

    The matmul rate depends strongly on the row count (a 1024-token prefill chunk runs near the
    machine's peak, a 32-row decode step well below it), so one rate at a mean shape misjudges
    both. Steps are grouped by the power of two of their token count; each group's FLOPs are
    timed at the group's mean shape."""
    groups: dict[int, list[tuple[int, int]]] = {}
    for tokens, sampled in steps:
        groups.setdefault(tokens.bit_length(), []).append((tokens, sampled))
    total = 0.0
    for members in groups.values():
        flops = sum(gemm_flops(gemms(args, t, s)) for t, s in members)
        mean = gemms(
            args,
            round(statistics.fmean(t for t, _ in members)),
            round(statistics.fmean(s for _, s in members)),
        )
        total += flops / matmul_rate(mean, device, repeats)
    return total
