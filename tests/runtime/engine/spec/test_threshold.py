"""The batch above which steps draft nothing: chosen from step times by a pure function (synthetic
figures here, no timing measured), overridden by the setting, measured by a warmed engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.config import load_settings
from runtime.engine.config import EngineConfig
from runtime.engine.engine import Engine
from runtime.engine.spec.attach import resolve_threshold
from runtime.engine.spec.config import SpecConfig
from runtime.engine.spec.planner import Speculator
from runtime.engine.spec.threshold import (
    DEFAULT_MAX_BATCH,
    choose_max_batch,
    expected_emitted,
    monotone,
    speculation_gain,
    step_seconds,
)
from runtime.memory import Allocator
from runtime.models.loader import load_model
from tests.runtime.engine.support import engine_config

SIZES = (1, 2, 4, 8, 16, 32, 64)
# a step that costs the same for 1 to 64 one-token rows (weights read once): verifying is cheap
FLAT = [(float(n), 0.010) for n in SIZES]
# a step whose time is proportional to its tokens (arithmetic-bound): verifying costs k + 1 steps
LINEAR = [(float(n), 0.001 * n) for n in SIZES]
# flat up to 8 rows, then linear: verification pays at small batches only
KNEE = [(float(n), 0.010 * max(1.0, n / 8)) for n in SIZES]


def test_expected_emitted_and_step_time_interpolation() -> None:
    assert expected_emitted(0.0, 4) == 1.0
    assert expected_emitted(1.0, 4) == 5.0
    assert expected_emitted(0.5, 2) == pytest.approx(1.75)
    assert step_seconds(KNEE, 0.5) == 0.010  # flat below the smallest size
    assert step_seconds(KNEE, 12) == pytest.approx(0.015)  # linear between 8 and 16
    assert step_seconds(KNEE, 128) == pytest.approx(0.160)  # the largest's throughput past it


def test_cheap_verification_gives_a_large_threshold() -> None:
    chosen = choose_max_batch(FLAT, k=4, acceptance=0.6, max_batch=64)
    assert chosen.source == "measured"
    # flat to 64 tokens: batch b's chunks are 5b tokens, free while 5b <= 64, then linear; the
    # gain E·T(b)/T(5b) = 2.31 x 64/(5b) stays >= 1 up to b = 29
    assert chosen.max_batch == 29
    assert chosen.gain_at_1 == pytest.approx(expected_emitted(0.6, 4))
    assert choose_max_batch(FLAT, k=4, acceptance=0.6, max_batch=6).max_batch == 6  # the cap


def test_expensive_verification_gives_one() -> None:
    chosen = choose_max_batch(LINEAR, k=4, acceptance=0.95, max_batch=64)
    assert chosen.max_batch == 1
    assert chosen.gain_at_1 is not None and chosen.gain_at_1 < 1.0


def test_the_knee_and_the_draft_cost_move_the_threshold() -> None:
    ngram = choose_max_batch(KNEE, k=4, acceptance=0.6, max_batch=64).max_batch
    assert 1 < ngram < 8
    # gain(b) in the linear part = E·T(b)/T(5b): the higher the acceptance, the further it goes
    assert choose_max_batch(KNEE, k=4, acceptance=0.95, max_batch=64).max_batch > ngram
    # a draft as dear as the target's step: k draft steps cost more than E - 1 tokens save
    assert speculation_gain(FLAT, 1, 4, 0.95, draft_share=1.0) < 1.0
    assert (
        choose_max_batch(FLAT, k=4, acceptance=0.95, max_batch=64, draft_share=1.0).max_batch == 1
    )
    cheap_draft = choose_max_batch(FLAT, k=4, acceptance=0.95, max_batch=64, draft_share=0.1)
    assert cheap_draft.max_batch > 1


def test_a_noisy_small_size_does_not_decide() -> None:
    # a size preempted during the sweep (slower than larger sizes) is read as the larger's time
    noisy = [(1.0, 0.010), (2.0, 0.050), (4.0, 0.010), (8.0, 0.010), (16.0, 0.020)]
    assert monotone(noisy) == [
        (1.0, 0.010),
        (2.0, 0.010),
        (4.0, 0.010),
        (8.0, 0.010),
        (16.0, 0.020),
    ]
    clean = [(1.0, 0.010), (2.0, 0.010), (4.0, 0.010), (8.0, 0.010), (16.0, 0.020)]
    assert choose_max_batch(noisy, k=4, acceptance=0.6, max_batch=16) == choose_max_batch(
        clean, k=4, acceptance=0.6, max_batch=16
    )


def test_too_few_sizes_is_an_error() -> None:
    with pytest.raises(ValueError, match="two batch sizes"):
        choose_max_batch([(1.0, 0.01)], k=4, acceptance=0.6, max_batch=8)


def test_the_setting_overrides_and_auto_leaves_it_to_the_warm_up() -> None:
    config = SpecConfig(method="ngram", max_batch_for_speculation=3)
    chosen = resolve_threshold(config, [(1.0, 0.01), (2.0, 0.01)], max_batch=64)
    assert (chosen.max_batch, chosen.source) == (3, "setting")
    for value in ("auto", None):
        settings = load_settings(speculative_method="ngram", max_batch_for_speculation=value)
        assert EngineConfig.from_settings(settings).spec.max_batch_for_speculation is None
    settings = load_settings(speculative_method="ngram", max_batch_for_speculation=5)
    assert EngineConfig.from_settings(settings).spec.max_batch_for_speculation == 5


def _speculator_of(model_dir: Path, **overrides: object) -> Speculator:
    loaded = load_model(model_dir, device="cpu")
    engine = Engine(
        engine_config(**overrides), loader=lambda: loaded, allocator=Allocator(device="cpu")
    )
    try:
        engine.load()
        speculator = engine._parts.core.scheduler.speculator
        assert isinstance(speculator, Speculator)
        return speculator
    finally:
        engine.shutdown()


@pytest.mark.parametrize("method", ["ngram", "self_draft"])
def test_a_warmed_engine_measures_its_threshold(
    demo_model_dir: Callable[[str], Path], method: str
) -> None:
    speculator = _speculator_of(
        demo_model_dir("llama"), batch_warmup=True, max_num_seqs=16, spec=SpecConfig(method=method)
    )
    threshold = speculator.threshold
    assert threshold.source == "measured"
    assert 1 <= threshold.max_batch <= 16
    assert speculator.max_batch == threshold.max_batch


def test_without_warm_up_the_default_and_with_a_setting_the_setting(
    demo_model_dir: Callable[[str], Path],
) -> None:
    path = demo_model_dir("llama")
    plain = _speculator_of(path, batch_warmup=False, spec=SpecConfig(method="ngram"))
    assert (plain.threshold.max_batch, plain.threshold.source) == (DEFAULT_MAX_BATCH, "default")
    given = SpecConfig(method="ngram", max_batch_for_speculation=2)
    warmed = _speculator_of(path, batch_warmup=True, spec=given)
    assert (warmed.threshold.max_batch, warmed.threshold.source) == (2, "setting")
