"""Logprobs and sampling controls on a CUDA device (`pytest -m cuda`): the engine on the GPU (fp32,
decode steps on the captured fast path) against transformers on the CPU, with rows that ask for
logprobs, prompt logprobs and controls batched beside rows that ask for nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.memory import Allocator
from tests.runtime.engine.support import random_prompts

pytestmark = pytest.mark.cuda
TOL = 1e-4


@pytest.mark.timeout(600)
def test_logprobs_on_cuda_match_transformers(demo_model_dir: Callable[[str], Path]) -> None:
    from transformers import AutoModelForCausalLM

    path = demo_model_dir("llama")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    config = EngineConfig(
        model_path=path, model_name="tiny", device="cuda", max_num_batched_tokens=32
    )
    engine = Engine(config, allocator=Allocator(device="cuda"))
    vocab = engine.loaded.args.vocab_size
    prompts = random_prompts(8, 3, 60, vocab, seed=21)
    asking = SamplingParams(
        max_tokens=8,
        temperature=1.0,
        seed=3,
        ignore_eos=True,
        logprobs=4,
        prompt_logprobs=4,
        presence_penalty=1.0,
        repetition_penalty=1.3,
        logit_bias=((5, 3.0),),
        min_tokens=4,
    )
    plain = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    try:
        handles = [
            engine.submit(GenerationRequest(f"r{i}", p, asking if i % 2 else plain))
            for i, p in enumerate(prompts)
        ]
        outs = [h.result(timeout=300) for h in handles]
    finally:
        engine.shutdown()
    assert engine.loaded.device.type == "cuda"
    for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        with torch.inference_mode():
            ids = torch.tensor([prompt + out.token_ids])
            expected = torch.log_softmax(hf(ids).logits[0].float(), dim=-1)
        if i % 2 == 0:
            assert out.logprobs is None and out.prompt_logprobs is None
            greedy = expected[len(prompt) - 1 : -1].argmax(dim=-1).tolist()
            assert out.token_ids == greedy
            continue
        assert out.logprobs is not None and out.prompt_logprobs is not None
        for j, entry in enumerate(out.logprobs):
            row = expected[len(prompt) - 1 + j]
            assert abs(entry.logprob - float(row[out.token_ids[j]])) < TOL
            values = row.topk(4).values.tolist()
            assert all(abs(a[1] - b) < TOL for a, b in zip(entry.top, values, strict=True))
        for p in range(1, len(prompt)):
            prompt_entry = out.prompt_logprobs[p]
            assert prompt_entry is not None
            assert abs(prompt_entry.logprob - float(expected[p - 1, prompt[p]])) < TOL
