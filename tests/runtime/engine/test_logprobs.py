"""Logprobs through the engine against `torch.log_softmax` of transformers' logits (fp32, tiny
random models): sampled tokens with their top-k alternatives, every prompt position (also in
chunked prefill and with the prompt already in the prefix cache), and the cumulative sum."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from runtime.engine.engine import Engine
from runtime.engine.logprobs import TokenLogprob
from runtime.engine.request import GenerationRequest, TokenOutput
from runtime.engine.sampling import SamplingParams
from runtime.errors import InvalidRequestError
from tests.runtime.engine.support import RecordingSink, engine_config, random_prompts

TOL = 1e-4
K = 5


@pytest.fixture(scope="module", params=["llama", "gemma"])
def model_dir(request: pytest.FixtureRequest, demo_model_dir: Callable[[str], Path]) -> Path:
    return demo_model_dir(request.param)


@pytest.fixture(scope="module")
def hf_model(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def sink() -> RecordingSink:
    return RecordingSink()


@pytest.fixture(scope="module")
def engine(model_dir: Path, sink: RecordingSink) -> Iterator[Engine]:
    # a small token budget: the 40-token prompts below are prefilled in chunks of 16
    eng = Engine(engine_config(model_path=model_dir, max_num_batched_tokens=16), sink=sink)
    yield eng
    eng.shutdown()


def hf_logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: row p is log_softmax of the logits after ids[: p + 1]."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def assert_entry(entry: TokenLogprob, expected_row: torch.Tensor, token_id: int, k: int) -> None:
    assert entry.token_id == token_id
    assert abs(entry.logprob - float(expected_row[token_id])) < TOL
    assert entry.rank == int((expected_row > expected_row[token_id]).sum()) + 1
    values, ids = expected_row.topk(k)
    assert len(entry.top) == k
    for (got_id, got), want_id, want in zip(entry.top, ids.tolist(), values.tolist(), strict=True):
        # a near-tie may swap two ids; the values must still agree in order
        assert abs(got - want) < TOL
        assert abs(got - float(expected_row[got_id])) < TOL or got_id == want_id


def run(engine: Engine, prompt: list[int], params: SamplingParams, rid: str) -> TokenOutput:
    return engine.submit(GenerationRequest(rid, prompt, params)).result(timeout=120)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampled_and_prompt_logprobs_match_transformers(
    engine: Engine, hf_model: torch.nn.Module, temperature: float
) -> None:
    vocab = engine.loaded.args.vocab_size
    for i, prompt in enumerate(random_prompts(3, 3, 40, vocab, seed=int(temperature) + 7)):
        params = SamplingParams(
            max_tokens=6,
            temperature=temperature,
            seed=i,
            ignore_eos=True,
            logprobs=K,
            prompt_logprobs=K,
            presence_penalty=1.5,  # the controls change the draw, never the reported values
        )
        out = run(engine, prompt, params, f"lp-{temperature}-{i}")
        expected = hf_logprobs(hf_model, prompt + out.token_ids)
        assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == 6
        for j, (entry, token_id) in enumerate(zip(out.logprobs, out.token_ids, strict=True)):
            assert_entry(entry, expected[len(prompt) - 1 + j], token_id, K)
        assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(prompt)
        assert out.prompt_logprobs[0] is None
        for p in range(1, len(prompt)):
            prompt_entry = out.prompt_logprobs[p]
            assert prompt_entry is not None
            assert_entry(prompt_entry, expected[p - 1], prompt[p], K)
        assert out.cumulative_logprob is not None
        assert abs(out.cumulative_logprob - sum(e.logprob for e in out.logprobs)) < 1e-5


def test_prompt_logprobs_do_not_read_the_prefix_cache(
    engine: Engine, hf_model: torch.nn.Module
) -> None:
    prompt = random_prompts(1, 48, 48, engine.loaded.args.vocab_size, seed=3)[0]
    plain = SamplingParams(max_tokens=1, temperature=0.0)
    run(engine, prompt, plain, "warm-1")
    warm = run(engine, prompt, plain, "warm-2")
    assert warm.cached_tokens > 0  # the prompt's pages are cached now
    scored = run(engine, prompt, SamplingParams(max_tokens=1, prompt_logprobs=0), "score")
    assert scored.cached_tokens == 0
    assert scored.prompt_logprobs is not None
    expected = hf_logprobs(hf_model, prompt)
    for p in range(1, len(prompt)):
        entry = scored.prompt_logprobs[p]
        assert entry is not None and entry.top == ()
        assert abs(entry.logprob - float(expected[p - 1, prompt[p]])) < TOL


def test_rows_that_ask_nothing_get_nothing(engine: Engine, sink: RecordingSink) -> None:
    prompt = random_prompts(1, 5, 5, engine.loaded.args.vocab_size, seed=4)[0]
    out = run(engine, prompt, SamplingParams(max_tokens=3, temperature=0.0), "plain")
    assert out.logprobs is None and out.prompt_logprobs is None
    assert out.cumulative_logprob is None
    # cumulative only (what best_of ranks by): the sum, without per-token entries
    params = SamplingParams(max_tokens=3, temperature=0.0, cumulative_logprob=True)
    ranked = run(engine, prompt, params, "cumulative")
    assert ranked.logprobs is None and ranked.cumulative_logprob is not None
    assert ranked.cumulative_logprob < 0
    asked = run(engine, prompt, SamplingParams(max_tokens=1, logprobs=0), "asked")
    assert asked.logprobs is not None and asked.logprobs[0].top == ()
    deadline = time.monotonic() + 30  # records reach the sink one loop turn after the output
    while "asked" not in sink.by_id() and time.monotonic() < deadline:
        time.sleep(0.01)
    records = sink.by_id()
    # inference_log.logprobs: what the client asked for (cumulative alone is internal)
    assert [records[r].logprobs for r in ("plain", "cumulative", "asked")] == [False, False, True]
    assert all(records[r].logprobs for r in records if r.startswith(("lp-", "score")))


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": 21}, "logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"logit_bias": ((3, 101.0),)}, "logit_bias"),
        ({"logit_bias": ((-1, 1.0),)}, "logit_bias"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ],
)
def test_bad_values_name_the_field(fields: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**fields)  # type: ignore[arg-type]
    assert info.value.param == param


def test_logit_bias_token_beyond_the_vocabulary(engine: Engine) -> None:
    vocab = engine.loaded.args.vocab_size
    params = SamplingParams(max_tokens=1, logit_bias=((vocab, 1.0),))
    with pytest.raises(InvalidRequestError) as info:
        engine.submit(GenerationRequest("big-bias", [5, 6], params))
    assert info.value.param == "logit_bias"


def test_prompt_logprobs_survive_preemption(model_dir: Path, hf_model: torch.nn.Module) -> None:
    """A page budget too small for the batch: sequences are preempted mid-prompt and mid-output
    and recompute; every logprob still equals transformers' (none doubled or lost)."""
    from tests.runtime.engine.test_paged_parity import TINY_PAGE_BYTES

    if "gemma" in str(model_dir):
        pytest.skip("the page size constant is the tiny llama's")
    config = engine_config(
        model_path=model_dir,
        max_num_batched_tokens=16,
        kv_cache_bytes=11 * TINY_PAGE_BYTES,
        initial_num_seqs=8,
        min_num_seqs=8,
    )
    engine = Engine(config)
    prompts = random_prompts(8, 30, 60, engine.loaded.args.vocab_size, seed=9)
    params = SamplingParams(
        max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=1, prompt_logprobs=1
    )
    try:
        handles = [
            engine.submit(GenerationRequest(f"pre-{i}", p, params)) for i, p in enumerate(prompts)
        ]
        outs = [h.result(timeout=300) for h in handles]
        assert engine.kv_cache_stats().num_preemptions > 0
    finally:
        engine.shutdown()
    for prompt, out in zip(prompts, outs, strict=True):
        expected = hf_logprobs(hf_model, prompt + out.token_ids)
        assert out.prompt_logprobs is not None and out.logprobs is not None
        assert len(out.logprobs) == 24
        for p in range(1, len(prompt)):
            entry = out.prompt_logprobs[p]
            assert entry is not None
            assert abs(entry.logprob - float(expected[p - 1, prompt[p]])) < TOL
        for j, sampled in enumerate(out.logprobs):
            want = float(expected[len(prompt) - 1 + j, out.token_ids[j]])
            assert abs(sampled.logprob - want) < TOL
