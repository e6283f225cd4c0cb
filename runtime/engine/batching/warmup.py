"""The load-time warm-up sweep that seeds the step-time model.

The model can only separate a step's fixed cost from its marginal cost once it has seen steps of
clearly different sizes; live traffic may not show them for a while (a steady load sits at one
batch size), and until then the controller holds. So at load, before the engine loop starts, a
few batches of throwaway greedy requests (1, 2, 4, …, 64 sequences up to the batch cap, a short
prompt and four decode steps each) run through the real schedule → execute → update path, with
the stats sink and the close hooks muted: no metric, trace or `inference_log` row sees them, and
their KV is freed before the first real request arrives. On the tiny demo model it takes a few
tens of milliseconds; on the `small` llama on CPU one to two seconds.

This module is the plan; runtime.engine.warmup runs it on the core.
"""

from __future__ import annotations

from dataclasses import dataclass

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
