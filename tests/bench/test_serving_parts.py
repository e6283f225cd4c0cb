"""make_workload's ranges (the soak draws its own; the serving bench keeps its defaults), and
the per-step matmul accounting of fraction_of_matmul_peak."""

from __future__ import annotations

import pytest
import torch

from bench import serving_parts
from bench.serving_parts import gemm_flops, gemms, ideal_matmul_seconds, make_workload
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


def test_ideal_matmul_time_rates_each_step_group_at_its_own_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a fake machine whose matmul rate is proportional to the row count of the layer GEMMs
    def rate(shapes: list[tuple[int, int, int]], device: torch.device, repeats: int) -> float:
        return 1e9 * shapes[0][0]

    monkeypatch.setattr(serving_parts, "matmul_rate", rate)
    args = ModelArgs(
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
    steps = [(1024, 1), (1000, 2), (32, 32), (32, 32), (17, 17)]  # groups: 2^10, 2^5, 2^4
    got = ideal_matmul_seconds(args, steps, torch.device("cpu"))

    def flops(group: list[tuple[int, int]]) -> float:
        return sum(gemm_flops(gemms(args, t, s)) for t, s in group)

    want = flops(steps[:2]) / 1012e9 + flops(steps[2:4]) / 32e9 + flops(steps[4:]) / 17e9
    assert got == pytest.approx(want)
