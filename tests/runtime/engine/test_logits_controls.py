"""Sampling controls (runtime.engine.logits) against transformers' own logits processors and
`generate`, and presence/frequency against OpenAI's documented formula; rows that ask for none
are left bit for bit."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from runtime.engine.engine import Engine
from runtime.engine.logits import process_logits
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from tests.runtime.engine.support import engine_config, random_prompts

VOCAB = 64


def row(params: SamplingParams, prompt: list[int], output: list[int], stop: set[int]) -> Any:
    """What process_logits reads of a Sequence."""
    return SimpleNamespace(
        request=SimpleNamespace(sampling=params),
        prompt_token_ids=prompt,
        output_token_ids=output,
        stop_checker=SimpleNamespace(stop_token_ids=frozenset(stop)),
    )


def test_each_control_matches_its_reference() -> None:
    from transformers import (
        MinNewTokensLengthLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SequenceBiasLogitsProcessor,
    )

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, VOCAB, generator=g) * 3
    prompt, output = [1, 2, 3, 3], [3, 4, 4, 9, 4]
    rows = [
        row(SamplingParams(max_tokens=8), prompt, output, {0}),  # asks nothing
        row(SamplingParams(max_tokens=8, repetition_penalty=1.7), prompt, output, {0}),
        row(SamplingParams(max_tokens=8, logit_bias=((5, 7.5), (6, -100.0))), prompt, output, {0}),
        row(SamplingParams(max_tokens=8, min_tokens=6), prompt, output, {0, 11}),
        row(
            SamplingParams(max_tokens=8, presence_penalty=0.7, frequency_penalty=-0.4),
            prompt,
            output,
            {0},
        ),
    ]
    got = logits.clone()
    assert process_logits(got, rows) == [1, 2, 3, 4]
    assert torch.equal(got[0], logits[0])
    ids = torch.tensor([prompt + output])
    want = RepetitionPenaltyLogitsProcessor(1.7)(ids, logits[1:2].clone())
    torch.testing.assert_close(got[1:2], want, rtol=0, atol=1e-6)
    want = SequenceBiasLogitsProcessor([[[5], 7.5], [[6], -100.0]])(ids, logits[2:3].clone())
    torch.testing.assert_close(got[2:3], want, rtol=0, atol=1e-6)
    want = MinNewTokensLengthLogitsProcessor(len(prompt), 6, [0, 11])(ids, logits[3:4].clone())
    torch.testing.assert_close(got[3:4], want, rtol=0, atol=0)
    # OpenAI: mu[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence (outputs only)
    want_row = logits[4].clone()
    for token in set(output):
        want_row[token] -= output.count(token) * -0.4 + 0.7
    torch.testing.assert_close(got[4], want_row, rtol=0, atol=1e-6)


def test_min_tokens_lifts_the_mask_once_reached() -> None:
    logits = torch.zeros(1, VOCAB)
    done = row(SamplingParams(max_tokens=8, min_tokens=2), [1], [5, 6], {0})
    assert process_logits(logits, [done]) == []
    assert torch.equal(logits, torch.zeros(1, VOCAB))


@pytest.fixture(scope="module")
def model_dir(demo_model_dir: Callable[[str], Path]) -> Path:
    return demo_model_dir("llama")


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[Engine]:
    eng = Engine(engine_config(model_path=model_dir))
    yield eng
    eng.shutdown()


def hf_generate(model_dir: Path, prompt: list[int], n: int, **processors: Any) -> list[int]:
    """Greedy decoding with transformers' logits processors on a full forward per token (its
    cached `generate` drifts from its own full forward on these random models; the engine is
    checked against the full forward, as tests/runtime/engine/support.hf_greedy does)."""
    from transformers import (
        AutoModelForCausalLM,
        LogitsProcessorList,
        MinNewTokensLengthLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SequenceBiasLogitsProcessor,
    )

    model = (
        _HF.get(model_dir)
        or AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    )
    _HF[model_dir] = model
    chain = LogitsProcessorList()
    if "repetition_penalty" in processors:
        chain.append(RepetitionPenaltyLogitsProcessor(processors["repetition_penalty"]))
    if "sequence_bias" in processors:
        chain.append(SequenceBiasLogitsProcessor(processors["sequence_bias"]))
    if "min_new_tokens" in processors:
        eos = processors["eos_token_id"]
        chain.append(
            MinNewTokensLengthLogitsProcessor(len(prompt), processors["min_new_tokens"], eos)
        )
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        for _ in range(n):
            scores = chain(ids, model(ids).logits[:, -1].float())  # type: ignore[arg-type]
            ids = torch.cat([ids, scores.argmax(-1).view(1, 1)], dim=1)
            if int(ids[0, -1]) == processors.get("eos_token_id"):
                break
    return ids[0, len(prompt) :].tolist()


_HF: dict[Path, torch.nn.Module] = {}


def engine_greedy(engine: Engine, prompt: list[int], rid: str, **fields: Any) -> list[int]:
    params = SamplingParams(temperature=0.0, **fields)
    return engine.submit(GenerationRequest(rid, prompt, params)).result(timeout=120).token_ids


def test_greedy_with_controls_matches_transformers_generate(
    engine: Engine, model_dir: Path
) -> None:
    vocab = engine.loaded.args.vocab_size
    eos = engine.tokenizer.eos_token_ids[0]
    changed = 0
    for i, prompt in enumerate(random_prompts(3, 4, 20, vocab, seed=11)):
        plain = engine_greedy(engine, prompt, f"plain-{i}", max_tokens=12, ignore_eos=True)
        got = engine_greedy(
            engine, prompt, f"rep-{i}", max_tokens=12, ignore_eos=True, repetition_penalty=1.5
        )
        want = hf_generate(model_dir, prompt, 12, repetition_penalty=1.5)
        assert got == want
        changed += got != plain
        biased = [(plain[0], -100.0), (7, 100.0)]  # forbid the first greedy token, force 7
        got = engine_greedy(
            engine, prompt, f"bias-{i}", max_tokens=4, ignore_eos=True, logit_bias=tuple(biased)
        )
        want = hf_generate(model_dir, prompt, 4, sequence_bias=[[[t], b] for t, b in biased])
        assert got == want == [7, 7, 7, 7]
    assert changed > 0  # the penalty changed some greedy run: the comparison had teeth
    # eos pushed to the top: min_tokens holds it off for exactly that many tokens
    prompt = random_prompts(1, 6, 6, vocab, seed=12)[0]
    got = engine_greedy(
        engine, prompt, "min", max_tokens=10, min_tokens=5, logit_bias=((eos, 100.0),)
    )
    want = hf_generate(
        model_dir, prompt, 10, sequence_bias=[[[eos], 100.0]], min_new_tokens=5, eos_token_id=eos
    )
    assert got == want and len(got) == 6 and got[-1] == eos
