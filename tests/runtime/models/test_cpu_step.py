"""The compiled CPU decode step (runtime.models.fast.cpu_step), inductor for real on the tiny
llama: greedy tokens and logits of compiled decode steps against the eager forward (the loaded
model itself, uncompiled), float32 at batch 1 (its own graph) and 3 (the dynamic one), int4 at
batch 3; a compile failure decodes eagerly instead, the fallback counted and logged once, and
the engine reports it on its step stats (the tokens: transformers')."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch

from runtime.engine.config import EngineConfig
from runtime.engine.engine import Engine
from runtime.engine.stats import RequestStats, StepStats, VerificationResult
from runtime.memory import Allocator
from runtime.memory.kv_cache import SequenceKV
from runtime.models.base import CausalLM, SeqSlice
from runtime.models.fast.build import FastPathOptions, get_fast_path
from runtime.models.fast.compile_cache import inductor_cache_dir
from runtime.models.fast.cpu_step import CompiledStep
from runtime.models.loader import load_model
from tests.runtime.engine.support import greedy, hf_greedy, request

Step = Callable[[torch.Tensor, list[SeqSlice]], torch.Tensor]
PROMPTS = [[5, 17, 99, 3, 250], [7], [300, 2, 41, 8, 9, 10, 11, 12, 13]]
NUM_STEPS = 6


def decode(model: CausalLM, step: Step, prompts: list[list[int]]) -> tuple[list, list]:
    """Prefill each prompt on the eager forward, then NUM_STEPS greedy decode steps of the whole
    batch on `step` -> (tokens per step, logits [batch, vocab] per step)."""
    a = model.args
    pool = SequenceKV.empty(a.num_layers, a.num_kv_heads, a.head_dim, 64 * len(prompts))
    kvs = [SequenceKV(pool.data) for _ in prompts]
    for i, kv in enumerate(kvs):  # one pool (a step's sequences share one), 64 tokens each
        kv.page_ids = pool.page_ids[4 * i : 4 * i + 4]
    last = []
    for prompt, kv in zip(prompts, kvs, strict=True):
        hidden = model(torch.tensor(prompt), [SeqSlice(0, len(prompt), kv)])
        kv.advance(len(prompt))
        last.append(int(model.compute_logits(hidden[-1:]).argmax(-1)))
    tokens, logits = [], []
    for _ in range(NUM_STEPS):
        ids = torch.tensor(last)
        hidden = step(ids, [SeqSlice(i, i + 1, kv) for i, kv in enumerate(kvs)])
        for kv in kvs:
            kv.advance(1)
        rows = model.compute_logits(hidden)
        last = rows.argmax(-1).tolist()
        tokens.append(last)
        logits.append(rows)
    return tokens, logits


@pytest.fixture(scope="module")
def compile_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("inductor")


def check_against_eager(model: CausalLM, step: CompiledStep, batches: list, atol: float) -> None:
    """After the warm-up nothing compiles again (a recompile would raise, and the step fall
    back): the graphs built at load serve every decode step."""
    with torch.inference_mode(), torch._dynamo.config.patch(error_on_recompile=True):
        for prompts in batches:
            before = step.num_compiled_steps
            got_tokens, got_logits = decode(model, step, prompts)
            want_tokens, want_logits = decode(model, model, prompts)
            assert step.num_compiled_steps == before + NUM_STEPS  # none fell back
            assert got_tokens == want_tokens
            for got, want in zip(got_logits, want_logits, strict=True):
                torch.testing.assert_close(got, want, atol=atol, rtol=0)


@pytest.mark.slow
def test_compiled_fp32_steps_match_the_eager_forward(
    demo_model_dir: Callable[[str], Path], compile_root: Path
) -> None:
    loaded = load_model(demo_model_dir("llama"), device="cpu")
    model = loaded.model
    assert isinstance(model, CausalLM)
    fast = get_fast_path(loaded, FastPathOptions(compile="on", max_batch=4, cache_dir=compile_root))
    assert fast is not None and isinstance(fast.step, CompiledStep)
    assert fast.kind == "inductor" and fast.num_compile_fallbacks == 0, fast.fallback_reason
    assert any(compile_root.iterdir()), "inductor's caches went under the model's directory"
    # batch 1 runs its own graph, batch 3 the dynamic one
    check_against_eager(model, fast.step, [PROMPTS[:1], PROMPTS], atol=1e-4)


@pytest.mark.slow
def test_compiled_int4_steps_match_the_eager_forward(
    demo_model_dir: Callable[[str], Path], compile_root: Path
) -> None:
    """Quantized: the int4 kernel and its bf16 casts inside the graph (one graph: batch 3)."""
    loaded = load_model(demo_model_dir("llama"), device="cpu", quantization="int4")
    model = loaded.model
    assert isinstance(model, CausalLM)
    step = CompiledStep(model)
    with inductor_cache_dir(compile_root / "int4"):
        step.warm_up(sizes=(2,))
    assert step.is_compiled, step.fallback_reason
    check_against_eager(model, step, [PROMPTS], atol=1e-2)


@pytest.fixture
def failing_compile(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An inductor that cannot build anything (no C++ compiler, say)."""

    def compile_that_fails(fn: object, **_: object) -> Callable[..., object]:
        def run(*args: object, **kwargs: object) -> object:
            raise RuntimeError("C++ compile failed: no compiler\nmore detail")

        return run

    monkeypatch.setattr(torch, "compile", compile_that_fails)
    yield


class Steps:
    def __init__(self) -> None:
        self.steps: list[StepStats] = []

    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None:
        if step is not None:
            self.steps.append(step)


def test_a_compile_failure_decodes_eagerly_counted_and_logged_once(
    demo_model_dir: Callable[[str], Path],
    compile_root: Path,
    failing_compile: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    path = demo_model_dir("llama")
    loaded = load_model(path, device="cpu")
    sink = Steps()
    config = EngineConfig(
        model_name="tiny",
        device="cpu",
        compile="on",
        compile_cache_dir=compile_root,
        batch_warmup=False,  # not what is tested: seconds
    )
    engine = Engine(config, sink, loader=lambda: loaded, allocator=Allocator(device="cpu"))
    try:
        out = engine.submit(request("r0", PROMPTS[0], greedy(5))).result(timeout=120)
    finally:
        engine.shutdown()
    fast = next(iter(loaded.fast_paths.values()))
    assert fast.num_compile_fallbacks == 1
    assert fast.fallback_reason == "RuntimeError: C++ compile failed: no compiler"
    failures = [r for r in caplog.records if "compiled decode step failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].levelno == logging.WARNING
    assert any("fell back" in r.getMessage() for r in caplog.records if r.name.endswith("build"))
    assert sink.steps and all(s.compile_fallbacks == 1 for s in sink.steps)
    assert [out.token_ids] == hf_greedy(path, [PROMPTS[0]], [5])  # transformers' tokens
