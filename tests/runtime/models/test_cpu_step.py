"""The compiled CPU decode step (runtime.models.fast.cpu_step), inductor for real on the tiny
llama: greedy tokens and logits of compiled decode steps against the eager forward (the loaded
model itself, uncompiled), float32 at batch 1 (its own graph) and 3 (the dynamic one), bf16, int8
and int4 at batch 3; a restart loads the graphs the first start saved (compiling nothing) and a
stale saved graph is refused; a step of prefills beside a decode runs the same graphs; a
compile failure decodes eagerly instead, the fallback counted and
logged once, and the engine reports it on its step stats (the tokens: transformers').

The compiles are the cost here (inductor's C++ builds: tens of seconds each on a busy 2-core
machine): one float32 model is compiled once for the module and shared, the other formats
compile only the dynamic graph, the restart and staleness tests reuse the saved files."""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
import torch

from runtime.engine.config import EngineConfig
from runtime.engine.engine import Engine
from runtime.engine.stats import RequestStats, StepStats, VerificationResult
from runtime.memory import Allocator
from runtime.memory.kv_pool import SequenceKV
from runtime.models import layers
from runtime.models.base import CausalLM, SeqSlice
from runtime.models.fast import precompiled
from runtime.models.fast.build import FastPath, FastPathOptions, get_fast_path
from runtime.models.fast.compile_cache import inductor_cache_dir
from runtime.models.fast.cpu_step import CompiledStep, graph_name
from runtime.models.loader import load_model
from tests.runtime.engine.support import greedy, hf_greedy, request

Step = Callable[[torch.Tensor, list[SeqSlice]], torch.Tensor]
PROMPTS = [[5, 17, 99, 3, 250], [7], [300, 2, 41, 8, 9, 10, 11, 12, 13]]
NUM_STEPS = 6


def decode(model: CausalLM, step: Step, prompts: list[list[int]]) -> tuple[list, list]:
    """Prefill each prompt on the eager forward, then NUM_STEPS greedy decode steps of the whole
    batch on `step` -> (tokens per step, logits [batch, vocab] per step)."""
    a = model.args
    dtype = model.embed_tokens.weight.dtype
    pool = SequenceKV.empty(a.num_layers, a.num_kv_heads, a.head_dim, 64 * len(prompts), dtype)
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


@dataclass
class Compiled:
    model: CausalLM
    fast: FastPath
    path: Path  # the checkpoint
    root: Path  # compile_cache_dir


@pytest.fixture(scope="module")
def fp32(demo_model_dir: Callable[[str], Path], compile_root: Path) -> Compiled:
    """The tiny llama, float32, its decode step compiled as `serve --compile on` does (both
    graphs, saved under compile_root): once for the module."""
    path = demo_model_dir("llama")
    loaded = load_model(path, device="cpu")
    model = loaded.model
    assert isinstance(model, CausalLM)
    fast = get_fast_path(loaded, FastPathOptions(compile="on", max_batch=4, cache_dir=compile_root))
    assert fast is not None and isinstance(fast.step, CompiledStep)
    return Compiled(model, fast, path, compile_root)


def check_against_eager(model: CausalLM, step: CompiledStep, batches: list, atol: float) -> None:
    """After the warm-up nothing compiles again (a compile would raise, and the step fall
    back): the graphs built at load serve every decode step."""
    with torch.inference_mode(), no_compiling():
        for prompts in batches:
            before = step.num_compiled_steps
            got_tokens, got_logits = decode(model, step, prompts)
            want_tokens, want_logits = decode(model, model, prompts)
            assert step.num_compiled_steps == before + NUM_STEPS  # none fell back
            assert got_tokens == want_tokens
            for got, want in zip(got_logits, want_logits, strict=True):
                torch.testing.assert_close(got, want, atol=atol, rtol=0)


@contextlib.contextmanager
def no_compiling() -> Iterator[None]:
    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError("compiled after the warm-up")

    with mock.patch.object(precompiled, "precompile", refuse):
        yield


@pytest.mark.slow
def test_compiled_fp32_steps_match_the_eager_forward(fp32: Compiled) -> None:
    assert isinstance(fp32.fast.step, CompiledStep)
    assert fp32.fast.kind == "inductor" and fp32.fast.num_compile_fallbacks == 0, (
        fp32.fast.fallback_reason
    )
    assert any(fp32.root.iterdir()), "inductor's caches went under the model's directory"
    # batch 1 runs its own graph, batch 3 the dynamic one
    check_against_eager(fp32.model, fp32.fast.step, [PROMPTS[:1], PROMPTS], atol=1e-4)


def mixed_step(model: CausalLM, step: Step) -> torch.Tensor:
    """One step that decodes PROMPTS[0]'s next token beside the whole prefills of PROMPTS[1:]
    (what the engine schedules when requests arrive while another decodes) -> hidden [T, H]."""
    a = model.args
    dtype = model.embed_tokens.weight.dtype
    pool = SequenceKV.empty(a.num_layers, a.num_kv_heads, a.head_dim, 64 * len(PROMPTS), dtype)
    kvs = [SequenceKV(pool.data) for _ in PROMPTS]
    for i, kv in enumerate(kvs):
        kv.page_ids = pool.page_ids[4 * i : 4 * i + 4]
    first, decoding = PROMPTS[0], kvs[0]
    model(torch.tensor(first), [SeqSlice(0, len(first), decoding)])  # its prefill, eager
    decoding.advance(len(first))
    ids, slices = [42], [SeqSlice(0, 1, decoding)]
    for prompt, kv in zip(PROMPTS[1:], kvs[1:], strict=True):
        slices.append(SeqSlice(len(ids), len(ids) + len(prompt), kv))
        ids += prompt
    return step(torch.tensor(ids), slices)


@pytest.mark.slow
def test_prefill_and_mixed_steps_run_the_compiled_graphs(fp32: Compiled) -> None:
    """The dynamic graph is the whole step for any token count: a step of prefills beside a
    decode gives the eager forward's hidden states, compiling nothing after the warm-up."""
    step = fp32.fast.step
    assert isinstance(step, CompiledStep) and fp32.fast.runs_prefill
    with torch.inference_mode(), no_compiling():
        before = step.num_compiled_steps
        got = mixed_step(fp32.model, step)
        assert step.num_compiled_steps == before + 1 and step.is_compiled, step.fallback_reason
        want = mixed_step(fp32.model, fp32.model)
    assert got.shape == (1 + len(PROMPTS[1]) + len(PROMPTS[2]), fp32.model.args.hidden_size)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_a_restart_loads_the_saved_graphs_and_compiles_nothing(
    fp32: Compiled, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    loaded = load_model(fp32.path, device="cpu")  # what a second start loads
    model = loaded.model
    assert isinstance(model, CausalLM) and model is not fp32.model
    with no_compiling():
        fast = get_fast_path(loaded, FastPathOptions(compile="on", cache_dir=fp32.root))
    assert fast is not None and isinstance(fast.step, CompiledStep)
    assert fast.num_compile_fallbacks == 0, fast.fallback_reason
    assert fast.step.num_loaded_graphs == 2
    assert sum("loaded the decode step" in r.getMessage() for r in caplog.records) == 2
    check_against_eager(model, fast.step, [PROMPTS[:1], PROMPTS], atol=1e-4)


@pytest.mark.slow
def test_a_stale_saved_graph_is_refused(
    fp32: Compiled, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unreadable, rejected by its guards (inputs of another dtype), or traced from changed
    code; another model's tensors look for another file."""
    step = fp32.fast.step
    assert isinstance(step, CompiledStep) and step.directory is not None
    layout = precompiled.layout_key(fp32.model)
    saved = precompiled.graph_path(step.directory, f"{graph_name(3)}-{layout}")
    with torch.inference_mode():  # as the step calls its graphs
        ids = torch.zeros(3, dtype=torch.long)
        cos, sin = fp32.model.rope_table().lookup(ids)
    example = (fp32.model, ids, cos, sin)
    assert precompiled.load(saved, example) is not None  # the one saved is good

    corrupt = tmp_path / "corrupt.graph"
    corrupt.write_bytes(saved.read_bytes()[:1000])
    with pytest.raises(precompiled.StaleGraph, match="unreadable"):
        precompiled.load(corrupt, example)
    with pytest.raises(precompiled.StaleGraph, match="not saved"):
        precompiled.load(tmp_path / "missing.graph", example)

    bf16 = load_model(fp32.path, device="cpu", dtype="bfloat16").model
    assert isinstance(bf16, CausalLM)
    assert precompiled.layout_key(bf16) != layout  # another model: another file
    with torch.inference_mode(), pytest.raises(precompiled.StaleGraph, match="guards"):
        precompiled.load(saved, (bf16, ids, cos.bfloat16(), sin.bfloat16()))

    real = inspect.getsource

    def edited(module: object) -> str:
        source = real(module)  # type: ignore[arg-type]
        return source + "# edited\n" if module is layers else source

    monkeypatch.setattr(precompiled.inspect, "getsource", edited)
    with pytest.raises(precompiled.StaleGraph, match=r"runtime\.models\.layers"):
        precompiled.load(saved, example)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "quantization", "atol"),
    [("bfloat16", None, 5e-2), ("float32", "int8", 1e-2), ("float32", "int4", 1e-2)],
    ids=["bf16", "int8", "int4"],
)
def test_compiled_steps_of_other_formats_match_the_eager_forward(
    demo_model_dir: Callable[[str], Path],
    compile_root: Path,
    dtype: str,
    quantization: str | None,
    atol: float,
) -> None:
    """bf16 activations; the int8/int4 kernels and their casts inside the graph (one graph:
    batch 3)."""
    loaded = load_model(
        demo_model_dir("llama"), device="cpu", dtype=dtype, quantization=quantization
    )
    model = loaded.model
    assert isinstance(model, CausalLM)
    step = CompiledStep(model)
    with inductor_cache_dir(compile_root / f"{dtype}-{quantization}"):
        step.warm_up(sizes=(2,))
    assert step.is_compiled, step.fallback_reason
    check_against_eager(model, step, [PROMPTS], atol=atol)


@pytest.fixture
def failing_compile(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An inductor that cannot build anything (no C++ compiler, say)."""

    class Failing:
        def aot_compile(self, *args: object, **kwargs: object) -> object:
            raise RuntimeError("C++ compile failed: no compiler\nmore detail")

    def compile_that_fails(fn: object, **_: object) -> Failing:
        return Failing()

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
    tmp_path: Path,
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
        compile_cache_dir=tmp_path,  # nothing saved: the compile runs (and fails)
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
