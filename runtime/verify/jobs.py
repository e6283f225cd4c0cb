"""A verification job and its check: what the reference path needs from a finished request
(`VerifyJob`), and `verify_jobs`, which recomputes a batch of them on the reference path and
probes the fast ops (the verifier's worker thread runs it; verifier.py has the queue and the
thread).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from runtime.engine.stats import VerificationResult
from runtime.models.lora.weights import LoraWeights
from runtime.verify.probes import probe_ops
from runtime.verify.reference import reference_forward
from runtime.verify.tolerance import (
    QUANTIZED_THRESHOLDS,
    chain_dtype,
    default_threshold,
    logit_tolerance,
)

if TYPE_CHECKING:
    from runtime.models.base import CausalLM

__all__ = ["LOGIT_OP", "VerifyJob", "verify_jobs"]

LOGIT_OP = "logit"


@dataclass(frozen=True)
class VerifyJob:
    """What the reference path needs from a finished request (no tensors of the engine's)."""

    request_id: str
    model_name: str  # `model` / `version` labels of the request's stats
    version: str
    model: CausalLM  # the production model: its weights are read, never written
    dtype: torch.dtype  # the serving dtype (the per-op probes run the fast ops in it)
    token_ids: tuple[int, ...]  # prompt + outputs but the last: what the final step saw
    chosen_token_id: int  # the last output token
    chosen_logit: float  # its production logit in the final step
    lora: LoraWeights | None = None  # the LoRA adapter it was served with (None: the base)


def verify_jobs(jobs: list[VerifyJob], threshold: float | None = None) -> list[VerificationResult]:
    """Jobs of one model and dtype, verified in one packed reference forward: per job the logit
    probe, then one probe per op, each with the tolerance it is to be checked against.
    `threshold`: the base (runtime.verify.tolerance); None: the default for the dtype and the
    model's quantization."""
    from runtime.models.quantize import is_quantized, runs_cpu_kernels

    model, dtype = jobs[0].model, jobs[0].dtype
    quantized = is_quantized(model)
    if threshold is None:
        threshold = default_threshold(str(dtype), _quantization(model) if quantized else None)
    logit_dtype = chain_dtype(
        dtype, is_quantized=quantized, int8_activations=quantized and runs_cpu_kernels(model)
    )
    assert all(j.model is model and j.dtype == dtype for j in jobs), "one model per call"
    digest = hashlib.blake2b(jobs[0].request_id.encode(), digest_size=4).digest()
    layer = int.from_bytes(digest, "big") % model.args.num_layers  # spread over the layers
    seqs = [(job.token_ids, job.chosen_token_id) for job in jobs]
    adapters = [job.lora for job in jobs] if any(job.lora for job in jobs) else None
    ref = reference_forward(model, seqs, capture_layer=layer, adapters=adapters)
    per_op = probe_ops(ref.inputs, dtype)
    now = time.time()
    results = []
    for job, expected_logit, probes in zip(jobs, ref.chosen_logits, per_op, strict=True):
        for op, output, expected in [(LOGIT_OP, job.chosen_logit, expected_logit), *probes]:
            bound = (
                logit_tolerance(threshold, logit_dtype, expected) if op == LOGIT_OP else threshold
            )
            results.append(
                VerificationResult(
                    job.request_id, job.model_name, job.version, op, output, expected, now, bound
                )
            )
    return results


def _quantization(model: nn.Module) -> str:
    """The method of the model's quantized layers whose default threshold is loosest (a GGUF
    model may hold several; `settings.quantization` says nothing of weights kept packed)."""
    methods = {getattr(m, "method", None) for m in model.modules()} & set(QUANTIZED_THRESHOLDS)
    return max(sorted(m for m in methods if m), key=QUANTIZED_THRESHOLDS.__getitem__)
