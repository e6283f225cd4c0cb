"""make_workload's ranges (the soak draws its own; the serving bench keeps its defaults), and
the per-step matmul accounting of fraction_of_matmul_peak."""

from __future__ import annotations

import pytest
import torch

from bench import serving_parts
from bench.serving_parts import (
    StepShape,
    gemm_flops,
    gemms,
    ideal_matmul_seconds,
    make_workload,
)
from runtime.models.config import ModelArgs


def test_ranges_and_vocabulary_are_respected() -> None:
    work = make_workload(
        200, quick=False, seed=3, prompt_lens=(8, 12), new_tokens=(1, 2), vocab_size=20
    )
    assert {len(p) for p in work.prompts} <= set(range(8, 13))
    assert set(work.new_tokens) == {1, 2}
    assert {t for p in work.prompts for t in p} <= set(range(4, 20))


def test_defaults_are_the_serving_workload() -> None:
    explicit = make_workload(16, quick=True, seed=1, prompt_lens=(16, 64), new_tokens=(8, 16))
    default = make_workload(16, quick=True, seed=1)
    assert explicit == default
    assert make_workload(16, quick=True, seed=2) != default


ARGS = ModelArgs(
    arch="llama",
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=4,
    norm_eps=1e-6,
)


def _flops(group: list[StepShape]) -> float:
    return sum(gemm_flops(gemms(ARGS, s.tokens, s.sampled)) for s in group)


def test_ideal_matmul_time_rates_each_step_group_at_its_own_shape_and_best_thread_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a fake machine whose matmul rate is proportional to the row count of the layer GEMMs, and
    # twice that on two threads
    def rate(shapes: list[tuple[int, int, int]], device: torch.device, repeats: int) -> float:
        return 1e9 * shapes[0][0] * torch.get_num_threads()

    monkeypatch.setattr(serving_parts, "matmul_rate", rate)
    slow = 1e3  # busy seconds far above the GEMMs' time: the engine is never the fastest
    steps = [StepShape(t, s, slow) for t, s in [(1024, 1), (1100, 2), (32, 32), (32, 32), (17, 17)]]
    before = torch.get_num_threads()
    got = ideal_matmul_seconds(ARGS, steps, torch.device("cpu"), thread_counts=(1, 2))
    assert torch.get_num_threads() == before  # restored
    want = _flops(steps[:2]) / 2124e9 + _flops(steps[2:4]) / 64e9 + _flops(steps[4:]) / 34e9
    assert got.seconds == pytest.approx(want)  # groups: 2^11, 2^6, 2^5, each at 2 threads' rate
    assert (got.groups, got.engine_fastest) == (3, 0)


def test_ideal_matmul_time_never_exceeds_the_engine_busy_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch.mm as slow as a small GEMM on two OpenMP threads with the other core taken (~100x):
    # the engine's own steps did the same GEMMs faster, so they set the group's peak
    monkeypatch.setattr(serving_parts, "matmul_rate", lambda shapes, device, repeats: 1.0)
    steps = [StepShape(32, 32, 0.004), StepShape(32, 32, 0.006), StepShape(1024, 1, 1e3)]
    got = ideal_matmul_seconds(ARGS, steps, torch.device("cpu"), thread_counts=(1,))
    assert got.engine_fastest == 2  # both groups: the engine beat a 1 FLOP/s torch.mm
    assert got.seconds == pytest.approx(0.004 + 0.006 + 1e3)
    assert got.seconds <= sum(s.busy_s for s in steps) * (1 + 1e-12)
