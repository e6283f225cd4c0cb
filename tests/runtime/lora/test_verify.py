"""Verification of adapted requests: the reference path (fp32, unfused) applies the same adapter,
so an intact LoRA forward shows no anomaly, and a reference without the adapter would."""

from __future__ import annotations

from pathlib import Path

from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.verify.reference import reference_forward
from storage.audit import default_threshold
from tests.runtime.engine.support import RecordingSink
from tests.runtime.verify.support import random_prompts, verified_engine


def test_adapted_requests_verify_clean(base_dir: Path, adapter_dirs: dict[str, Path]) -> None:
    recorder = RecordingSink()
    loras = tuple((name, str(path)) for name, path in adapter_dirs.items())
    names = ["a1", "a2", "", "a3", "a4", "a1"]
    prompts = random_prompts(len(names), 300, seed=6)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    with verified_engine(base_dir, [recorder], loras=loras) as (engine, verifier):
        handles = [
            engine.submit(GenerationRequest(f"v-{i}", p, params, lora=lora))
            for i, (p, lora) in enumerate(zip(prompts, names, strict=True))
        ]
        outputs = [h.result(timeout=120) for h in handles]
        assert verifier.flush(timeout=120)
        model = engine.loaded.model
        # without the adapter the reference disagrees with what was served
        seq = (*prompts[0], *outputs[0].token_ids[:-1])
        plain = reference_forward(model, [(seq, outputs[0].token_ids[-1])], capture_layer=0)
    threshold = default_threshold("float32", None)
    logits = {r.request_id: r for r in recorder.by_op()["logit"]}
    assert sorted(logits) == sorted(f"v-{i}" for i in range(len(names)))
    assert all(r.abs_error <= threshold for r in logits.values()), [
        (r.request_id, r.abs_error) for r in logits.values()
    ]
    assert abs(plain.chosen_logits[0] - logits["v-0"].output) > 10 * threshold
