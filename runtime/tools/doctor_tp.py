"""The model half of `fastllm doctor` under tensor parallelism (`--tensor-parallel-size` > 1):
the model is checked the way `serve` runs it, split over its ranks, never loaded whole (a
split model is one that need not fit one device).

    model loads sharded (N ranks)      the sizes divide, the workers start and load their shards
    tokenizer round trip and ranges    as for one process (rank 0 holds the tokenizer)
    sharded generation vs reference    a few greedy tokens through the engine (the step
                                       broadcast, the all_reduces), each request recomputed on
                                       the reference path, which gathers the other ranks' layers
                                       (runtime.models.parallel.gather): the logit and per-op
                                       probes within their tolerances
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from runtime.engine.stats import VerificationResult
from runtime.errors import FastllmError
from runtime.tools.doctor_model import check_tokenizer
from runtime.tools.doctor_report import FAIL, PASS, SKIP, CheckResult, DoctorOptions

if TYPE_CHECKING:
    from runtime.engine.engine import Engine

LOADS = "model loads sharded ({} ranks)"
TOKENIZER = "tokenizer round trip and ranges"
AGREES = "sharded generation vs gathered reference"
PROMPTS = ("Hello", "The capital of France is")
MAX_TOKENS = 4


class _Sink:
    """Keeps the verifier's results (a StatsSink of one method)."""

    def __init__(self) -> None:
        self.verified: list[VerificationResult] = []

    def record(self, step: object = None, finished: object = (), verified: Sequence = ()) -> None:
        self.verified.extend(verified)


def check_sharded(options: DoctorOptions, device: torch.device) -> list[CheckResult]:
    from runtime.engine.engine import Engine, EngineConfig
    from runtime.engine.tp.build import check

    world = options.tensor_parallel_size
    loads = LOADS.format(world)
    config = EngineConfig(
        model_name="doctor",
        model_path=options.model_path,
        device=str(device),
        dtype=options.dtype,
        legacy_support=options.legacy_support,
        quantization=None if options.quantization == "none" else options.quantization,
        tensor_parallel_size=world,
        kv_cache_bytes=8 << 20,
        compile="off",  # the split model runs eagerly (runtime.engine.tp_runner)
        batch_warmup=False,
    )
    engine = Engine(config)
    try:
        try:
            check(config)  # the sizes, in one line, before any worker starts
            engine.load()
        except FastllmError as exc:
            fix = (
                "pick a tensor_parallel_size that divides the model's heads, KV heads and "
                "intermediate size (or 1)"
                if "does not divide" in exc.message
                else "see the message; `fastllm doctor` without --tensor-parallel-size checks "
                "the checkpoint itself"
            )
            rest = [CheckResult(n, SKIP, "the shards did not load") for n in (TOKENIZER, AGREES)]
            return [CheckResult(loads, FAIL, exc.message, fix), *rest]
        loaded = engine.loaded
        args = loaded.args
        detail = f"{args.architecture or args.arch}, {args.num_layers} layers, {world} ranks"
        results = [CheckResult(loads, PASS, f"{detail} on {device}"), check_tokenizer(loaded)]
        results.append(_agrees(engine))
        return results
    finally:
        engine.shutdown()


def _agrees(engine: Engine) -> CheckResult:
    from runtime.engine.request import GenerationRequest
    from runtime.engine.sampling import SamplingParams
    from runtime.verify.verifier import Verifier

    sink = _Sink()
    verifier = Verifier(sink, sample_rate=1.0)
    engine.verifier = verifier
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    try:
        handles = [
            engine.submit(GenerationRequest(f"doctor-tp-{i}-{time.monotonic_ns()}", ids, params))
            for i, ids in enumerate(engine.tokenizer.encode(p) for p in PROMPTS)
        ]
        for handle in handles:
            handle.result(timeout=600)
        done = verifier.flush(timeout=600)
    except FastllmError as exc:
        fix = "a worker rank failed: the server log's tp-rankN lines say why"
        return CheckResult(AGREES, FAIL, exc.message, fix)
    finally:
        engine.verifier = None
        verifier.close()
    if not done or verifier.num_failed or len(sink.verified) == 0:
        detail = f"the reference path did not finish ({verifier.num_failed} failed)"
        return CheckResult(AGREES, FAIL, detail, "see the log's 'verify:' lines")
    worst = max(sink.verified, key=lambda r: r.abs_error / (r.tolerance or 1.0))
    logit = max(r.abs_error for r in sink.verified if r.op == "logit")
    bad = [r for r in sink.verified if r.tolerance is not None and r.abs_error > r.tolerance]
    detail = (
        f"{len(PROMPTS)} requests, max |logit - reference| {logit:.2e}; worst probe "
        f"{worst.op} {worst.abs_error:.2e} (tolerance {worst.tolerance or 0:.1e})"
    )
    if bad:
        fix = (
            f"the split forward disagrees with the reference ({bad[0].op}): check each rank's "
            "device and torch build, or serve with tensor_parallel_size 1 until fixed"
        )
        return CheckResult(AGREES, FAIL, detail, fix)
    return CheckResult(AGREES, PASS, detail)
