"""The fast-path check of `fastllm doctor`: what is built around the model's forward (its
decode call captured per batch bucket on CUDA, its layers' halves compiled with compile=on, its
whole decode step compiled on CPU) against the same forward as it is (uncaptured, uncompiled).
A compiled CPU step that fell back to the eager forward (it could not compile) fails the check
with inductor's reason: `serve` would start, slower than asked for.

Both decode the same prompt greedily from the same prefill (model level, scratch KV, no
engine); the check passes when every token agrees and the logits stay within the dtype's
tolerance, and reports each side's decode rate and their ratio (a single short run: a hint,
not a benchmark; `bench.generate` / `bench.peer` measure properly).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from runtime.memory.kv_pool import SequenceKV
from runtime.models.base import CausalLM, SeqSlice
from runtime.models.fast.build import FastPathOptions, get_fast_path
from runtime.models.loader import LoadedModel
from runtime.tools.doctor_report import FAIL, PASS, SKIP, CheckResult

NAME = "fast decode step matches eager"
NUM_TOKENS = 8
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.25, torch.float16: 0.05}  # logits, abs
Step = Callable[[Tensor, list[SeqSlice]], Tensor]


def _decode(model: CausalLM, step: Step, prompt: list[int]) -> tuple[list[int], Tensor, float]:
    """-> greedy tokens, their logits [NUM_TOKENS, vocab] (fp32), decode seconds."""
    a, weight = model.args, model.embed_tokens.weight
    capacity = len(prompt) + NUM_TOKENS
    kv = SequenceKV.empty(
        a.num_layers, a.num_kv_heads, a.head_dim, capacity, weight.dtype, weight.device
    )
    ids = torch.tensor(prompt, device=weight.device)
    hidden = model(ids, [SeqSlice(0, len(prompt), kv)])
    kv.advance(len(prompt))
    logits = model.compute_logits(hidden[-1:])
    tokens, rows = [], []
    start = time.perf_counter()
    for _ in range(NUM_TOKENS):
        token = logits.argmax(-1)
        tokens.append(int(token))
        hidden = step(token, [SeqSlice(0, 1, kv)])
        kv.advance(1)
        logits = model.compute_logits(hidden)
        rows.append(logits[0])
    return tokens, torch.stack(rows).float().cpu(), time.perf_counter() - start


def check_fast_path(loaded: LoadedModel, options: FastPathOptions | None = None) -> CheckResult:
    model = loaded.model
    if not isinstance(model, CausalLM):
        return CheckResult(NAME, SKIP, "encoder model (no decode step)")
    try:
        fast = get_fast_path(loaded, options or FastPathOptions(max_batch=8))
        if fast is None:
            detail = "nothing built beside the model's forward (compile off, or auto on a CPU)"
            return CheckResult(NAME, SKIP, detail)
        if fast.fallback_reason is not None:  # decoding eagerly: nothing to compare
            return _fell_back(fast.fallback_reason)
        prompt = [(7 * i + 3) % loaded.args.vocab_size for i in range(12)]
        with torch.inference_mode():
            _decode(model, fast, prompt[:2])  # warm-up both sides
            _decode(model, model, prompt[:2])
            fast_tokens, fast_logits, fast_s = _decode(model, fast, prompt)
            eager_tokens, eager_logits, eager_s = _decode(model, model, prompt)
    except Exception as exc:  # a fast path that cannot build or run is the finding
        fix = "serve with --compile off (FASTLLM_COMPILE=off) and report the error"
        return CheckResult(NAME, FAIL, f"{type(exc).__name__}: {exc}", fix)
    if fast.fallback_reason is not None:  # fell back while decoding
        return _fell_back(fast.fallback_reason)
    error = float((fast_logits - eager_logits).abs().max())
    tolerance = TOLERANCE[loaded.dtype]
    rates = (
        f"{fast.kind} {NUM_TOKENS / fast_s:.0f} tok/s vs eager {NUM_TOKENS / eager_s:.0f} tok/s "
        f"({eager_s / fast_s:.2f}x), startup {fast.startup_s:.2f} s"
    )
    if fast_tokens != eager_tokens or not error <= tolerance:
        detail = (
            f"tokens {fast_tokens} vs eager {eager_tokens}, max |logit diff| {error:.2e} "
            f"(tolerance {tolerance:.0e})"
        )
        fix = "serve with --compile off (FASTLLM_COMPILE=off) until fixed; see the op checks"
        return CheckResult(NAME, FAIL, detail, fix)
    detail = f"{NUM_TOKENS} tokens identical, max |logit diff| {error:.1e}; {rates}"
    return CheckResult(NAME, PASS, detail)


def _fell_back(reason: str) -> CheckResult:
    """The compiled CPU step could not be built or run: `serve` starts and decodes eagerly
    (counted by fastllm_compile_fallbacks), slower than asked for; the reason is inductor's."""
    detail = f"the compiled decode step fell back to the eager forward: {reason}"
    fix = (
        "inductor needs a working C++ compiler (g++ or clang) and Python headers, and a "
        "writable compile_cache_dir; or serve with --compile off (FASTLLM_COMPILE=off)"
    )
    return CheckResult(NAME, FAIL, detail, fix)


__all__ = ["FAIL", "NAME", "PASS", "check_fast_path"]
