"""The model half of `fastllm doctor`: load, GeGLU provenance, tokenizer, a short generation."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from runtime.errors import FastllmError
from runtime.models.fast.build import FastPathOptions
from runtime.tools.convert import META_CONVERTED_FROM, META_GEGLU_FIX, uses_geglu
from runtime.tools.doctor_fast import NAME as FAST
from runtime.tools.doctor_fast import check_fast_path
from runtime.tools.doctor_report import (
    FAIL,
    PASS,
    ROUND_TRIP_TEXT,
    SKIP,
    CheckResult,
    DoctorOptions,
)

if TYPE_CHECKING:
    from runtime.models.loader import LoadedModel


def check_model(options: DoctorOptions, device: torch.device) -> list[CheckResult]:
    from runtime.models.loader import load_model

    path = options.model_path
    assert path is not None
    name = f"model loads ({path})"
    try:
        loaded = load_model(
            path,
            dtype=options.dtype,
            device=device,
            legacy_support=options.legacy_support,
            quantization=options.quantization,
        )
    except FastllmError as exc:
        fix = (
            f"fastllm convert --input {path} --output {path}-converted (add --fix-geglu for "
            "a GeGLU model such as gemma)"
            if "legacy" in exc.message
            else "check the directory (config.json, weights, tokenizer.json); "
            "`fastllm make-demo-model DIR` builds a known-good one"
        )
        skipped = (*_MODEL_CHECKS, FAST, QUANT)
        rest = [CheckResult(n, SKIP, "the model did not load") for n in skipped]
        return [CheckResult(name, FAIL, exc.message, fix), *rest]
    args = loaded.args
    legacy = " (legacy pytorch_model.bin)" if loaded.is_legacy else ""
    detail = f"{args.architecture or args.arch}, {args.num_layers} layers on {device}{legacy}"
    return [
        CheckResult(name, PASS, detail),
        check_geglu_provenance(loaded),
        check_tokenizer(loaded),
        check_generation(loaded),
        check_fast_path(
            loaded,
            FastPathOptions(
                compile=options.compile, max_batch=8, cache_dir=options.compile_cache_dir
            ),
        ),
        check_quantized(loaded),
    ]


_MODEL_CHECKS = ("GeGLU weights normalised", "tokenizer round trip and ranges", "model generates")
QUANT = "quantized linears vs their dequantized reference"
QUANT_REL_TOL = 1e-2  # the kernels round activations to bf16 (runtime.models.quant)


def check_geglu_provenance(loaded: LoadedModel) -> CheckResult:
    name = _MODEL_CHECKS[0]
    if not uses_geglu(loaded.args):
        return CheckResult(name, PASS, f"{loaded.args.arch} has no GeGLU projections")
    fixed = loaded.metadata.get(META_GEGLU_FIX) == "1"
    origin = "legacy" if loaded.is_legacy else loaded.metadata.get(META_CONVERTED_FROM)
    fix = (
        f"fastllm convert --input {loaded.path} --output {loaded.path}-fixed --fix-geglu, "
        "then serve the new directory"
    )
    if origin == "legacy" and not fixed:
        how = (
            "loaded straight from a legacy pytorch_model.bin"
            if loaded.is_legacy
            else f"converted from a legacy file without --fix-geglu ({META_GEGLU_FIX}="
            f"{loaded.metadata.get(META_GEGLU_FIX, 'absent')})"
        )
        return CheckResult(name, FAIL, f"GeGLU checkpoint {how}", fix)
    if fixed:
        return CheckResult(name, PASS, f"{META_GEGLU_FIX}=1")
    return CheckResult(name, PASS, f"native safetensors checkpoint ({origin or 'not converted'})")


def check_tokenizer(loaded: LoadedModel) -> CheckResult:
    name = _MODEL_CHECKS[1]
    tok = loaded.tokenizer
    vocab = loaded.args.vocab_size
    if tok is None:
        return CheckResult(name, FAIL, "no tokenizer loaded", "add tokenizer.json to the model")
    fix_range = "the tokenizer does not belong to this model: ship the matching tokenizer.json"
    if tok.vocab_size > vocab:
        detail = f"tokenizer has {tok.vocab_size} entries, the embedding table {vocab}"
        return CheckResult(name, FAIL, detail, fix_range)
    ids = tok.encode(ROUND_TRIP_TEXT, add_special_tokens=False)
    specials = [
        i for i in (tok.bos_token_id, tok.pad_token_id, *tok.eos_token_ids) if i is not None
    ]
    bad = [i for i in ids + specials if not 0 <= i < vocab]
    if bad:
        return CheckResult(name, FAIL, f"token id {bad[0]} outside [0, {vocab})", fix_range)
    text = tok.decode(ids)
    if text != ROUND_TRIP_TEXT:
        detail = f"decode(encode(text)) gave {text!r}"
        fix = "check tokenizer.json (normalizer / decoder); the model sees different text"
        return CheckResult(name, FAIL, detail, fix)
    return CheckResult(name, PASS, f"{len(ids)} tokens round-trip; ids in [0, {vocab})")


def check_generation(loaded: LoadedModel) -> CheckResult:
    from runtime.engine.offline import generate
    from runtime.engine.sampling import SamplingParams

    name = _MODEL_CHECKS[2]
    if not loaded.is_causal_lm:
        return CheckResult(name, SKIP, "encoder model (embeddings only)")
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    try:
        (result,) = generate(loaded, ["Hello"], params)
    except Exception as exc:  # any failure in the forward is the finding
        return CheckResult(name, FAIL, f"{type(exc).__name__}: {exc}", "see the op checks above")
    if result.completion_tokens != params.max_tokens:
        detail = f"{result.completion_tokens} tokens instead of {params.max_tokens}"
        return CheckResult(name, FAIL, detail, "see the op checks above")
    return CheckResult(name, PASS, f"{result.completion_tokens} tokens greedy")


def check_quantized(loaded: LoadedModel) -> CheckResult:
    """Each quantized linear on random rows against the fp32 product with its own dequantized
    weights: a wrong kernel (or a packing it misreads) shows here, quantization error cannot."""
    import torch.nn.functional as F

    summary = loaded.quantization
    if summary is None:
        return CheckResult(QUANT, SKIP, "float weights")
    worst, worst_name = 0.0, ""
    gen = torch.Generator().manual_seed(0)
    for name, module in loaded.model.named_modules():
        if getattr(module, "method", None) not in ("int8", "int4", "fp8"):
            continue
        in_f = module.in_features
        x = torch.randn(4, in_f, generator=gen).to(device=loaded.device, dtype=loaded.dtype)
        with torch.inference_mode():
            want = F.linear(x.float(), module.weight, None)
            got = module(x).float() - (0 if module.bias is None else module.bias.float())
        err = float((got - want).abs().max() / want.abs().max().clamp(min=1e-12))
        if err > worst:
            worst, worst_name = err, name
    detail = (
        f"{len(summary.layers)} {summary.method} layers, worst relative error {worst:.1e} "
        f"({worst_name or 'none'})"
    )
    if worst > QUANT_REL_TOL:
        fix = "the quantized kernel is wrong on this device/torch: serve with quantization none"
        return CheckResult(QUANT, FAIL, detail, fix)
    return CheckResult(QUANT, PASS, detail)
