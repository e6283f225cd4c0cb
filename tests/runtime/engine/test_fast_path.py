"""The engine and what is built around the model's one forward: on CPU nothing by default (the
engine runs the forward as it is, transformers' outputs); compile=on's compiled view used for
decode steps, built once per loaded model, its outputs the uncompiled ones; the compile /
cuda_graphs settings, and the build logged at load. (inductor itself is swapped for the
identity here: compiling on this CPU takes minutes; tests/runtime/models/test_fast_cuda.py
runs it for real.)"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from runtime.config import Settings, load_settings
from runtime.engine.config import EngineConfig
from runtime.engine.engine import Engine
from runtime.engine.offline import generate
from runtime.errors import ConfigError
from runtime.memory import Allocator
from runtime.models.fast import precompiled
from runtime.models.fast.build import FastPathOptions, get_fast_path, plan_fast_path
from runtime.models.loader import load_model
from tests.fixtures.eager_graphs import eager_precompile
from tests.runtime.engine.support import greedy, hf_greedy, random_prompts, request


def run_engine(model_dir: Path, prompts: list[list[int]], max_tokens: int, **config):
    loaded = load_model(model_dir, device="cpu")
    engine = Engine(
        EngineConfig(model_name="tiny", device="cpu", max_num_seqs=16, **config),
        loader=lambda: loaded,
        allocator=Allocator(device="cpu"),
    )
    try:
        handles = [
            engine.submit(request(f"r{i}", p, greedy(max_tokens))) for i, p in enumerate(prompts)
        ]
        outputs = [h.result(timeout=120) for h in handles]
        runner = engine._parts.core.runner
        return [o.token_ids for o in outputs], runner.num_fast_steps, engine._parts.core.num_steps
    finally:
        engine.shutdown()


@pytest.fixture
def identity_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)
    monkeypatch.setattr(precompiled, "precompile", eager_precompile())  # the CPU step's


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_engine_runs_the_one_forward_on_cpu_with_hf_outputs(
    arch: str, demo_model_dir: Callable[[str], Path]
) -> None:
    path = demo_model_dir(arch)
    prompts = random_prompts(6, 1, 9, 500, seed=4)
    tokens, num_fast, num_steps = run_engine(path, prompts, 5)
    assert num_fast == 0 and num_steps > 1  # nothing built beside the forward on CPU
    assert tokens == hf_greedy(path, prompts, [5] * len(prompts))


def test_compiled_decode_steps_match_the_uncompiled_engine(
    demo_model_dir: Callable[[str], Path], identity_compile: None
) -> None:
    path = demo_model_dir("llama")
    prompts = random_prompts(6, 1, 9, 500, seed=4)
    compiled, num_fast, num_steps = run_engine(path, prompts, 5, compile="on")
    plain, num_plain_fast, _ = run_engine(path, prompts, 5, compile="off")
    assert compiled == plain
    # on CPU the compiled step is dynamic in the token count: prefill steps run it too
    assert num_fast == num_steps > 1
    assert num_plain_fast == 0


def test_offline_generate_passes_the_setting_through(
    demo_model_dir: Callable[[str], Path], identity_compile: None
) -> None:
    loaded = load_model(demo_model_dir("llama"), device="cpu")
    prompt = [[5, 6, 7, 8]]
    (compiled,) = generate(loaded, prompt, greedy(6), compile="on")
    assert loaded.fast_paths, "the compiled view was built and kept on the loaded model"
    built = next(iter(loaded.fast_paths.values()))
    assert built.step is not loaded.model  # a view: the loaded model stays uncompiled
    (again,) = generate(loaded, prompt, greedy(6), compile="on")
    assert next(iter(loaded.fast_paths.values())) is built  # not rebuilt per engine
    (plain,) = generate(loaded, prompt, greedy(6))
    assert compiled.token_ids == again.token_ids == plain.token_ids


def test_settings_reach_the_engine_and_bad_values_are_typed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().compile == "auto" and Settings().cuda_graphs == "auto"
    monkeypatch.setenv("FASTLLM_COMPILE", "off")
    monkeypatch.setenv("FASTLLM_CUDA_GRAPHS", "on")
    monkeypatch.setenv("FASTLLM_COMPILE_CACHE_DIR", "/var/cache/fastllm-compile")
    config = EngineConfig.from_settings(load_settings())
    assert (config.compile, config.cuda_graphs) == ("off", "on")
    assert config.fast_path.cache_dir == Path("/var/cache/fastllm-compile")
    monkeypatch.setenv("FASTLLM_COMPILE", "sometimes")
    with pytest.raises(ConfigError, match="FASTLLM_COMPILE"):
        load_settings()
    with pytest.raises(ConfigError, match="compile must be one of") as err:
        EngineConfig(compile="yes")
    assert err.value.param == "compile"


def test_what_each_mode_means_on_cpu() -> None:
    cpu = pytest.importorskip("torch").device("cpu")
    assert plan_fast_path(FastPathOptions(), cpu) is None  # no inductor, no graphs on CPU
    on = plan_fast_path(FastPathOptions(compile="on"), cpu)
    assert on is not None and on.kind == "inductor"
    assert plan_fast_path(FastPathOptions(compile="off"), cpu) is None
    with pytest.raises(ConfigError, match="cuda_graphs=on needs a CUDA device"):
        plan_fast_path(FastPathOptions(cuda_graphs="on"), cpu)


def test_cuda_graphs_on_without_a_gpu_fails_the_load_with_a_typed_error(
    demo_model_dir: Callable[[str], Path],
) -> None:
    loaded = load_model(demo_model_dir("llama"), device="cpu")
    with pytest.raises(ConfigError, match="cuda_graphs=on"):
        get_fast_path(loaded, FastPathOptions(cuda_graphs="on"))


def test_the_build_is_logged_at_load(
    demo_model_dir: Callable[[str], Path],
    caplog: pytest.LogCaptureFixture,
    identity_compile: None,
) -> None:
    caplog.set_level(logging.INFO, logger="runtime.engine.build")
    run_engine(demo_model_dir("llama"), [[3, 4]], 2, compile="on")
    run_engine(demo_model_dir("llama"), [[3, 4]], 2)
    lines = [r.getMessage() for r in caplog.records if r.name == "runtime.engine.build"]
    assert any(m.startswith("decode step: inductor on cpu (built in ") for m in lines), lines
    assert "decode step: the model's forward, uncompiled (compile=auto)" in lines
