"""generate(): greedy parity with transformers `generate`, stop handling, context limits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from runtime.engine.offline import generate
from runtime.engine.sampling import SamplingParams
from runtime.errors import InvalidRequestError
from runtime.models.loader import LoadedModel, load_model

PROMPTS = [
    "The cache",
    "Serving a language model is mostly a problem of moving numbers",
    "Hi",
    "Question: why batch requests together? Answer:",
]


@pytest.fixture(scope="module", params=["llama", "gemma", "gemma-untied"])
def arch_and_model(
    request: pytest.FixtureRequest,
    demo_model_dir: Callable[[str], Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, Path, LoadedModel]:
    if request.param == "gemma-untied":
        # the tied random gemma mostly repeats its input token (the scaled embedding dominates);
        # an untied head makes greedy decoding wander, so KV-cache / position bugs would show
        from runtime.models.demo import make_demo_model

        path = make_demo_model(
            tmp_path_factory.mktemp("gemma-untied"),
            arch="gemma",
            seed=1,
            overrides={"tie_word_embeddings": False},
        )
        return "gemma", path, load_model(path, device="cpu")
    path = demo_model_dir(request.param)
    return request.param, path, load_model(path, device="cpu")


def _hf_greedy(path: Path, arch: str, prompt_ids: list[int], n: int) -> list[int]:
    from transformers import GemmaForCausalLM, LlamaForCausalLM

    cls = LlamaForCausalLM if arch == "llama" else GemmaForCausalLM
    model = _HF_CACHE.get(path) or cls.from_pretrained(path, dtype=torch.float32).eval()
    _HF_CACHE[path] = model
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, min_new_tokens=0
        )
    return out[0, len(prompt_ids) :].tolist()


_HF_CACHE: dict[Path, torch.nn.Module] = {}


def test_greedy_batch_matches_transformers(arch_and_model: tuple[str, Path, LoadedModel]) -> None:
    arch, path, loaded = arch_and_model
    params = SamplingParams(max_tokens=32, temperature=0.0)
    results = generate(loaded, PROMPTS, params)
    assert loaded.tokenizer is not None
    for prompt, result in zip(PROMPTS, results, strict=True):
        prompt_ids = loaded.tokenizer.encode(prompt)
        # HF one prompt at a time, unpadded; it stops at eos exactly as we do
        assert result.token_ids == _hf_greedy(path, arch, prompt_ids, 32)
        assert result.prompt_tokens == len(prompt_ids)
        assert result.completion_tokens == len(result.token_ids)
        expected_reason = (
            "stop" if result.token_ids[-1] in loaded.tokenizer.eos_token_ids else "length"
        )
        assert result.finished_reason == expected_reason
        assert result.text == loaded.tokenizer.decode(result.token_ids)
    if path.name.startswith("gemma-untied"):
        assert all(len(set(r.token_ids)) > 8 for r in results)  # the check above had teeth


def test_batch_does_not_change_results(arch_and_model: tuple[str, Path, LoadedModel]) -> None:
    _, _, loaded = arch_and_model
    params = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, top_k=50, seed=123)
    together = generate(loaded, PROMPTS, params)
    alone = [generate(loaded, [p], params)[0] for p in PROMPTS]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    again = generate(loaded, PROMPTS, params)
    assert [r.token_ids for r in again] == [r.token_ids for r in together]


def test_stop_string_and_token_ids(arch_and_model: tuple[str, Path, LoadedModel]) -> None:
    _, _, loaded = arch_and_model
    base = generate(loaded, ["The cache"], SamplingParams(max_tokens=20, temperature=0.0))[0]
    assert len(base.text) > 4
    stop = base.text[2:4]
    cut = generate(
        loaded, ["The cache"], SamplingParams(max_tokens=20, temperature=0.0, stop=(stop,))
    )[0]
    assert cut.finished_reason == "stop"
    assert cut.text == base.text[: base.text.index(stop)]
    stop_id = base.token_ids[3]
    by_id = generate(
        loaded,
        ["The cache"],
        SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=(stop_id,)),
    )[0]
    assert by_id.finished_reason == "stop"
    assert by_id.token_ids == base.token_ids[: base.token_ids.index(stop_id) + 1]


def test_token_id_prompts_and_errors(arch_and_model: tuple[str, Path, LoadedModel]) -> None:
    _, _, loaded = arch_and_model
    assert loaded.tokenizer is not None
    ids = loaded.tokenizer.encode("The cache")
    params = SamplingParams(max_tokens=5, temperature=0.0)
    assert (
        generate(loaded, [ids], params)[0].token_ids
        == generate(loaded, ["The cache"], params)[0].token_ids
    )
    context = loaded.args.max_position_embeddings
    with pytest.raises(InvalidRequestError, match="context") as exc:
        generate(loaded, [[5] * context], params)
    assert exc.value.param == "prompt"
    with pytest.raises(InvalidRequestError) as exc:
        generate(loaded, [[5] * (context - 2)], params)
    assert exc.value.param == "max_tokens"
    with pytest.raises(InvalidRequestError) as exc:
        generate(loaded, [[loaded.args.vocab_size]], params)
    assert exc.value.param == "prompt"
    with pytest.raises(InvalidRequestError) as exc:
        generate(loaded, ["x"], SamplingParams(top_p=0))
    assert exc.value.param == "top_p"
