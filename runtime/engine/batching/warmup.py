"""The load-time warm-up sweep that seeds the step-time model.

The model can only separate a step's fixed cost from its marginal cost once it has seen steps of
clearly different sizes; live traffic may not show them for a while (a steady load sits at one
batch size), and until then the controller holds. So at load, before the engine loop starts, a
few batches of throwaway greedy requests (1, 2, 4, …, 64 sequences up to the batch cap, a short
prompt and four decode steps each) run through the real schedule → execute → update path, with
the stats sink and the close hooks muted: no metric, trace or `inference_log` row sees them, and
their KV is freed before the first real request arrives. On the tiny demo model it takes a few
tens of milliseconds; on the `small` llama on CPU one to two seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from runtime.engine.batching.step_model import StepTimeModel
from runtime.engine.request import GenerationRequest, RequestHandle
from runtime.engine.sampling import SamplingParams
from runtime.engine.sequence import Sequence
from runtime.engine.stats import FinishReason, RequestStats
from runtime.engine.stopping import StopChecker
from runtime.engine.threads import apply_num_threads

if TYPE_CHECKING:
    from runtime.engine.core import EngineCore
    from runtime.models.tokenizer import Tokenizer


REFERENCE_BATCH = 64  # the warm-up sweeps at least this far (the default max_num_seqs)


@dataclass(frozen=True)
class WarmupPlan:
    batch_sizes: tuple[int, ...]  # sequences per warm-up batch, each run to completion
    prompt_tokens: int = 1  # a prefill of one token per sequence costs what a decode does
    # tokens generated per sequence: one with the prefill, then 4 decode steps, so each size's
    # knot is a mean of several steps and can stand for the saturation throughput (curve.py)
    new_tokens: int = 5

    @classmethod
    def for_engine(cls, max_batch: int) -> WarmupPlan:
        """The engine's sweep: at least up to REFERENCE_BATCH whatever the cap, so an engine
        capped or pinned low still knows what a bigger batch delivers (its u is then the true
        share of the saturation throughput, not 1 for want of a comparison)."""
        return cls.for_max_batch(max(max_batch, REFERENCE_BATCH))

    @classmethod
    def for_max_batch(cls, max_batch: int) -> WarmupPlan:
        """Powers of 2 from 1 below the cap, and the cap itself: knots a factor 2 apart. The
        sweep is the reference curve's shape (StepTimeModel.seal_warmup) and a size between two
        knots is read by interpolation: across a knee a factor 4 read a batch 2x past it ~25% too
        slow. The sizes below the cap sum to less than the cap, so this costs at most twice the
        largest batch's steps."""
        sizes = {2**k for k in range(16) if 2**k < max_batch} | {max_batch}
        return cls(tuple(sorted(sizes)))


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
