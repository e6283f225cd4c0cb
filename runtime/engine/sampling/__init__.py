"""Sampling: a request's parameters and feature flags, decided once; the step's sampling batch,
built once per step; the sampler.

    params.py      SamplingParams: the fields, and the request's feature flags (cached)
    checks.py      every check of those fields, in one place
    draw.py        temperature / top-k / top-p and the draw; `sample`, the per-call form
    rows.py        what the batch reads of a sequence (a protocol)
    batch.py       SamplingBatch.build(rows): tensors or None per feature, fork rows, logprob
                   rows, and only the logits processors some row needs
    processors.py  penalties, logit_bias, min_tokens, the grammar mask: each owns its rows
    penalties.py, bias.py, min_tokens.py   the processors' kernels
    sampler.py     Sampler(logits, batch) -> SamplerOutput(token_ids, logprobs | None)

Only the light modules are imported here (request.py imports SamplingParams from this package):
take SamplingBatch and Sampler from their own modules.
"""

from runtime.engine.sampling.checks import MAX_CHOICES, MAX_STOP_STRINGS
from runtime.engine.sampling.draw import apply_top_k_top_p, make_generator, sample
from runtime.engine.sampling.params import SamplingParams

__all__ = [
    "MAX_CHOICES",
    "MAX_STOP_STRINGS",
    "SamplingParams",
    "apply_top_k_top_p",
    "make_generator",
    "sample",
]
