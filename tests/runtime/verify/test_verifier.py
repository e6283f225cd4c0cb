"""runtime.verify: sampling, the reference path against transformers, per-op fault isolation, and
the worker's guarantees (bounded queue, failures contained, requests never affected)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from runtime.models import ops
from runtime.models.loader import load_model
from runtime.verify.reference import reference_forward
from runtime.verify.verifier import Verifier, is_sampled
from storage.audit import default_threshold
from tests.runtime.verify.support import (
    Recorder,
    corrupting,
    random_prompts,
    serve,
    verified_engine,
)

FP32 = default_threshold("float32")
ACT = {"llama": "swiglu", "gemma": "geglu"}


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared machine
    yield
    torch.set_num_threads(before)


@functools.cache
def hf_model(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_logit(model_dir: Path, token_ids: list[int], token: int) -> float:
    model = hf_model(model_dir)
    with torch.inference_mode():
        return float(model(torch.tensor([token_ids])).logits[0, -1, token])


def test_sampling_is_deterministic_and_near_the_rate() -> None:
    ids = [f"chatcmpl-{i}" for i in range(20000)]
    picked = [i for i in ids if is_sampled(i, 0.01)]
    assert picked == [i for i in ids if is_sampled(i, 0.01)]
    assert 120 <= len(picked) <= 280  # binomial(20000, 0.01): mean 200, sd 14
    assert all(is_sampled(i, 1.0) for i in ids[:100])
    assert not any(is_sampled(i, 0.0) for i in ids[:100])


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_reference_forward_matches_transformers(
    arch: str, demo_model_dir: Callable[[str], Path]
) -> None:
    path = demo_model_dir(arch)
    model = load_model(path, device="cpu").model
    prompts = random_prompts(3, 500, max_len=12, seed=3)  # packed together in one call
    seqs = [(ids, 11 + i) for i, ids in enumerate(prompts)]
    ref = reference_forward(model, seqs, capture_layer=1)  # type: ignore[arg-type]
    expected = [hf_logit(path, ids, token) for ids, token in seqs]
    assert ref.chosen_logits == pytest.approx(expected, abs=1e-4)
    assert ref.inputs.layer == 1 and ref.inputs.act == ACT[arch]
    assert ref.inputs.lengths == [len(p) for p in prompts]
    assert ref.inputs.q.shape[0] == sum(ref.inputs.lengths)


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_every_request_is_verified_at_rate_one(
    arch: str, demo_model_dir: Callable[[str], Path]
) -> None:
    path = demo_model_dir(arch)
    recorder = Recorder()
    prompts = random_prompts(12, 500)
    with verified_engine(path, [recorder]) as (engine, verifier):
        outputs = serve(engine, prompts, max_tokens=3)
        assert verifier.flush(timeout=60)
    assert verifier.num_verified == len(prompts) and verifier.num_failed == 0
    by_op = recorder.by_op()
    assert set(by_op) == {"logit", "rms_norm", "rotary", "attention", ACT[arch]}
    for results in by_op.values():
        assert sorted(r.request_id for r in results) == sorted(f"req-{i}" for i in range(12))
        assert all(r.abs_error <= FP32 for r in results), results
    # the logit probe's output is the production value of the final step, for the same token
    first = next(r for r in by_op["logit"] if r.request_id == "req-0")
    tokens = outputs[0].token_ids
    assert first.output == pytest.approx(hf_logit(path, prompts[0] + tokens[:-1], tokens[-1]), 1e-4)


# production attention is two ops: `attention` (a sequence alone: a fresh prefill, or pages in
# one run) and `masked_attention` (the batched call); which ones a step runs depends on how the
# requests were batched, so production logits are sure to go wrong only when both are broken
@pytest.mark.parametrize("fast_ops, probe", [
    (("rms_norm",), "rms_norm"),
    (("rotary",), "rotary"),  # the kernel the forward calls (q and k in one call)
    (("attention", "masked_attention"), "attention"),
    (("attention",), "attention"),
    (("masked_attention",), "attention"),
    (("swiglu",), "swiglu"),
])  # fmt: skip
def test_a_broken_op_is_pinpointed(
    fast_ops: tuple[str, ...],
    probe: str,
    demo_model_dir: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for fast_op in fast_ops:
        monkeypatch.setattr(ops, fast_op, corrupting(getattr(ops, fast_op)))
    recorder = Recorder()
    with verified_engine(demo_model_dir("llama"), [recorder]) as (engine, verifier):
        serve(engine, random_prompts(8, 500, seed=1), max_tokens=2)
        assert verifier.flush(timeout=60)
    by_op = recorder.by_op()
    assert len(by_op[probe]) == 8
    assert all(r.abs_error > FP32 for r in by_op[probe])  # every sampled request shows it
    for other in {"rms_norm", "rotary", "attention", "swiglu"} - {probe}:
        assert all(r.abs_error <= FP32 for r in by_op[other]), other  # and only that op
    if probe != "attention" or len(fast_ops) == 2:  # see above
        assert any(r.abs_error > FP32 for r in by_op["logit"])  # production logits went wrong too


def test_rate_zero_verifies_nothing(demo_model_dir: Callable[[str], Path]) -> None:
    recorder = Recorder()
    with verified_engine(demo_model_dir("llama"), [recorder], sample_rate=0.0) as (e, v):
        serve(e, random_prompts(6, 500))
        assert v.flush(timeout=10)
    assert v.num_submitted == 0 and recorder.verified == []
    assert len(recorder.finished) == 6


def test_full_queue_drops_and_counts(demo_model_dir: Callable[[str], Path]) -> None:
    recorder = Recorder()
    verifier = Verifier(recorder, sample_rate=1.0, queue_size=2, autostart=False)
    with verified_engine(demo_model_dir("llama"), [recorder], verifier=verifier) as (e, v):
        outputs = serve(e, random_prompts(6, 500))  # the worker is not running: queue fills
        assert all(o.finished_reason == "length" and o.error is None for o in outputs)
        assert (v.num_submitted, v.num_dropped) == (2, 4)
        v.start()
        assert v.flush(timeout=60)
    assert v.num_verified == 2
    assert len({r.request_id for r in recorder.verified}) == 2


def test_a_failing_reference_is_counted_not_raised(
    demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(job: object) -> list[object]:
        raise RuntimeError("reference path broke")

    monkeypatch.setattr("runtime.verify.verifier.verify_jobs", boom)
    recorder = Recorder()
    with verified_engine(demo_model_dir("llama"), [recorder]) as (engine, verifier):
        outputs = serve(engine, random_prompts(3, 500))
        assert verifier.flush(timeout=30)
    assert all(o.error is None for o in outputs)
    assert (verifier.num_failed, verifier.num_verified) == (3, 0)
    assert recorder.verified == [] and len(recorder.finished) == 3


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_serving_stays_within_its_threshold(
    dtype: str, demo_model_dir: Callable[[str], Path]
) -> None:
    recorder = Recorder()
    with verified_engine(demo_model_dir("gemma"), [recorder], dtype=dtype) as (engine, verifier):
        serve(engine, random_prompts(16, 500, seed=2), max_tokens=2)
        assert verifier.flush(timeout=60)
    assert verifier.num_verified == 16
    errors = {op: max(r.abs_error for r in rs) for op, rs in recorder.by_op().items()}
    assert all(e <= default_threshold(dtype) for e in errors.values()), errors
    assert max(errors.values()) > FP32 / 100  # it really ran in low precision
