"""Speculative decoding is exact for greedy requests: the same tokens, token for token, as the
plain engine (and as transformers for a few prompts), over random and repetitive prompts, n > 1,
stop strings, max_tokens, and preemption; the KV pages drafted past a rejection go back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.engine.engine import Engine
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.engine.spec.config import SpecConfig
from runtime.memory import Allocator
from runtime.models.loader import LoadedModel, load_model
from tests.runtime.engine.support import (
    RecordingSink,
    engine_config,
    greedy,
    hf_greedy,
    random_prompts,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
from tests.runtime.engine.support import one_torch_thread  # noqa: E402,F401  (the fixture)


@pytest.fixture(scope="module")
def llama(demo_model_dir: Callable[[str], Path]) -> tuple[Path, LoadedModel]:
    path = demo_model_dir("llama")
    return path, load_model(path, device="cpu")


def _prompts(vocab: int) -> list[list[int]]:
    prompts = random_prompts(16, 2, 40, vocab, seed=3)
    prompts += [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 10, [40] * 20, list(range(3, 60)) * 2]
    return prompts


def _run(
    loaded: LoadedModel,
    prompts: list[list[int]],
    params: list[SamplingParams],
    spec: SpecConfig,
    sink: RecordingSink | None = None,
    **overrides: object,
) -> tuple[list[list[int]], list[str], Engine]:
    config = engine_config(batch_warmup=False, spec=spec, **overrides)
    engine = Engine(config, sink, loader=lambda: loaded, allocator=Allocator(device="cpu"))
    try:
        handles = [
            engine.submit(GenerationRequest(f"r{i}", prompt, p))
            for i, (prompt, p) in enumerate(zip(prompts, params, strict=True))
        ]
        ids: list[list[int]] = []
        texts: list[str] = []
        for handle in handles:  # choices interleave (TokenOutput.index): each on its own
            by_choice: dict[int, tuple[list[int], list[str]]] = {}
            for out in handle:
                assert out.error is None
                tokens, pieces = by_choice.setdefault(out.index, ([], []))
                tokens.extend(out.token_ids)
                pieces.append(out.text)
            for index in sorted(by_choice):
                ids.append(by_choice[index][0])
                texts.append("".join(by_choice[index][1]))
        assert engine.kv_cache_stats().num_used_pages == 0  # every page back, drafted ones too
    finally:
        engine.shutdown()
    return ids, texts, engine


NGRAM = SpecConfig(method="ngram", num_speculative_tokens=4, max_batch_for_speculation=64)


@pytest.mark.parametrize("method", ["ngram", "self_draft"])
@pytest.mark.parametrize("k", [1, 4, 16])
def test_greedy_is_token_for_token_the_plain_output(
    llama: tuple[Path, LoadedModel], k: int, method: str
) -> None:
    _, loaded = llama
    prompts = _prompts(loaded.args.vocab_size)
    params = [greedy(24 + i % 9) for i in range(len(prompts))]
    plain, _, _ = _run(loaded, prompts, params, SpecConfig())
    sink = RecordingSink()
    spec = SpecConfig(method=method, num_speculative_tokens=k, max_batch_for_speculation=64)
    drafted, _, _ = _run(loaded, prompts, params, spec, sink)
    assert drafted == plain
    accepted = sum(s.num_accepted_tokens for s in sink.steps)
    assert sum(s.num_draft_tokens for s in sink.steps) > 0
    assert accepted > 0  # the repetitive prompts' drafts hit: the check above had teeth
    assert sum(r.spec_accepted_tokens for r in sink.finished) == accepted


def test_greedy_ngram_matches_transformers(llama: tuple[Path, LoadedModel]) -> None:
    path, loaded = llama
    prompts = _prompts(loaded.args.vocab_size)[-4:] + _prompts(loaded.args.vocab_size)[:2]
    drafted, _, _ = _run(loaded, prompts, [greedy(20)] * len(prompts), NGRAM)
    assert drafted == hf_greedy(path, prompts, [20] * len(prompts))


def test_n_choices_stop_strings_and_eos(llama: tuple[Path, LoadedModel]) -> None:
    _, loaded = llama
    prompts = _prompts(loaded.args.vocab_size)
    tokenizer = loaded.tokenizer
    assert tokenizer is not None
    plain_ids, _, _ = _run(loaded, prompts, [greedy(24)] * len(prompts), SpecConfig())
    # a stop string taken from the middle of each plain output: the run must stop there too
    params = []
    for ids in plain_ids:
        piece = tokenizer.decode(ids[8:10]).strip()
        stop = (piece,) if piece else ()
        params.append(SamplingParams(max_tokens=24, temperature=0.0, stop=stop, n=2))
    plain = _run(loaded, prompts, params, SpecConfig())
    for config in (NGRAM, SELF_DRAFT):
        spec = _run(loaded, prompts, params, config)
        assert spec[0] == plain[0] and spec[1] == plain[1]
    assert any(len(ids) < 24 for ids in spec[0])  # some stop strings did stop early
    # eos honoured (not ignored): identical too
    eos_params = [SamplingParams(max_tokens=30, temperature=0.0)] * len(prompts)
    assert (
        _run(loaded, prompts, eos_params, NGRAM)[:2]
        == _run(loaded, prompts, eos_params, SpecConfig())[:2]
    )


SELF_DRAFT = SpecConfig(method="self_draft", num_speculative_tokens=4, max_batch_for_speculation=64)


@pytest.mark.parametrize("spec", [NGRAM, SELF_DRAFT], ids=["ngram", "self_draft"])
def test_preemption_keeps_outputs_identical(
    llama: tuple[Path, LoadedModel], spec: SpecConfig
) -> None:
    _, loaded = llama
    prompts = _prompts(loaded.args.vocab_size)
    params = [greedy(40)] * len(prompts)
    args = loaded.args
    page_bytes = 16 * 2 * args.num_layers * args.num_kv_heads * args.head_dim * 4
    sink = RecordingSink()
    small = {"kv_cache_bytes": 24 * page_bytes}  # far fewer pages than the batch wants
    plain, _, _ = _run(loaded, prompts, params, SpecConfig())
    drafted, _, _ = _run(loaded, prompts, params, spec, sink, **small)
    assert drafted == plain
    assert sink.steps[-1].kv is not None and sink.steps[-1].kv.num_preemptions > 0
    assert sum(s.num_accepted_tokens for s in sink.steps) > 0


def test_per_request_opt_out_runs_plain_and_features_speculate(
    llama: tuple[Path, LoadedModel],
) -> None:
    _, loaded = llama
    prompt = [5, 6, 7, 8, 9] * 6
    config = engine_config(batch_warmup=False, spec=NGRAM)
    sink = RecordingSink()
    engine = Engine(config, sink, loader=lambda: loaded, allocator=Allocator(device="cpu"))
    try:
        out = engine.submit(GenerationRequest("a", prompt, greedy(20), speculative=False)).result()
        # a logits control (a zero bias changes no logit) and logprobs speculate too
        # (test_controls.py and test_logprobs.py check their values)
        biased = greedy(20, logit_bias=((3, 0.0),))
        bias = engine.submit(GenerationRequest("b", prompt, biased)).result()
        logprobs = engine.submit(GenerationRequest("d", prompt, greedy(20, logprobs=2))).result()
        on = engine.submit(GenerationRequest("c", prompt, greedy(20))).result()
    finally:
        engine.shutdown()
    assert out.token_ids == on.token_ids == logprobs.token_ids == bias.token_ids
    drafted = {r.request_id: r.spec_draft_tokens for r in sink.finished}
    assert drafted["a"] == 0 and drafted["b"] > 0 and drafted["c"] > 0 and drafted["d"] > 0


def test_above_max_batch_no_step_drafts(llama: tuple[Path, LoadedModel]) -> None:
    _, loaded = llama
    prompts = [[5, 6, 7, 8, 9] * 6] * 6
    spec = SpecConfig(method="ngram", num_speculative_tokens=4, max_batch_for_speculation=2)
    sink = RecordingSink()
    _run(loaded, prompts, [greedy(6)] * 4 + [greedy(24)] * 2, spec, sink)
    for step in sink.steps:
        if step.num_draft_tokens:
            assert step.num_seqs <= 2
    assert any(s.num_draft_tokens for s in sink.steps)  # the tail (<= 2 left) drafted


def test_self_draft_of_an_int4_model_in_int4_is_refused(
    demo_model_dir: Callable[[str], Path],
) -> None:
    from runtime.errors import ConfigError, ModelLoadError

    with pytest.raises(ConfigError, match="would be the served weights") as refused:
        engine_config(quantization="int4", spec=SELF_DRAFT)  # settings: refused before any load
    assert "\n" not in str(refused.value)
    loaded = load_model(demo_model_dir("llama"), device="cpu", quantization="int4")
    engine = Engine(
        engine_config(batch_warmup=False, spec=SELF_DRAFT),
        loader=lambda: loaded,
        allocator=Allocator(device="cpu"),
    )
    with pytest.raises(ModelLoadError, match="served in int4 already") as info:
        engine.load()
    assert "\n" not in str(info.value)
