"""Runs the load-time warm-up sweep (runtime.engine.batching.warmup's plan) on the engine core,
before its loop starts: throwaway greedy sequences through the real schedule → execute → update
path, with the stats sink and the close hooks muted."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from runtime.engine.batching.step_model import StepTimeModel
from runtime.engine.batching.warmup import WarmupPlan
from runtime.engine.request import GenerationRequest, RequestHandle
from runtime.engine.sampling import SamplingParams
from runtime.engine.sequence import Sequence
from runtime.engine.stats import FinishReason, RequestStats
from runtime.engine.stopping import StopChecker
from runtime.engine.threads import apply_num_threads

if TYPE_CHECKING:
    from runtime.engine.core import EngineCore
    from runtime.models.tokenizer import Tokenizer

__all__ = ["run_warmup"]


def _sequence(
    request_id: str, prompt: list[int], new_tokens: int, tokenizer: Tokenizer
) -> Sequence:
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    return Sequence(
        request=GenerationRequest(request_id, prompt, params),
        handle=RequestHandle(request_id),
        stats=RequestStats(request_id=request_id, model="warmup"),
        deadline=math.inf,
        stop_checker=StopChecker(tokenizer, params, prompt),
    )


def run_warmup(core: EngineCore, tokenizer: Tokenizer, plan: WarmupPlan, vocab_size: int) -> int:
    """Run the plan on `core` (not started yet); returns the number of steps it took."""
    prompt = [(7 * i + 5) % vocab_size for i in range(plan.prompt_tokens)]
    sink, on_close = core.sink, core.on_close
    core.sink, core.on_close = None, None
    num_steps = 0
    threads = torch.get_num_threads()  # the caller's count, given back after the sweep
    if core.config.num_threads is not None:  # the sweep's steps run as the loop's will
        apply_num_threads(core.config.num_threads)
    try:
        for size in plan.batch_sizes:
            seqs = [
                _sequence(f"warmup-{size}-{i}", prompt, plan.new_tokens, tokenizer)
                for i in range(size)
            ]
            with core.lock:
                for seq in seqs:
                    core.add(seq)
            # bounded: a KV budget too small for the batch leaves some waiting; stop there
            for _ in range(size * (plan.prompt_tokens + plan.new_tokens) + 1):
                if not core.step_once(size):
                    break
                num_steps += 1
            with core.lock:
                for seq in seqs:  # anything left (held for KV room): out, its KV freed
                    core.close(seq, finished_reason=FinishReason.CANCELLED)
                core.records.clear()
    finally:
        core.sink, core.on_close = sink, on_close
        torch.set_num_threads(threads)
    model = getattr(core.controller.source, "model", None)
    if isinstance(model, StepTimeModel):  # the sweep becomes the reference curve's shape
        model.seal_warmup()
    return num_steps
