"""make_workload's ranges (the soak draws its own; the serving bench keeps its defaults)."""

from __future__ import annotations

from bench.serving_parts import make_workload


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
