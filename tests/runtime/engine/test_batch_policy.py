"""Adaptive batch controller: the control law, the control interval, run-time policy changes, and
convergence under a synthetic workload. All on a virtual clock; nothing sleeps."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.config import load_settings
from runtime.engine.batching.controller import (
    AdaptiveBatchController,
    BatchPolicyConfig,
    Demand,
    FakeUtilization,
    UtilizationSource,
)
from runtime.errors import ConfigError, InvalidRequestError


def controller(initial: int = 10, value: float | None = None, **kw: object):
    source = FakeUtilization(value)
    config = BatchPolicyConfig(initial=initial, **kw)  # type: ignore[arg-type]
    return AdaptiveBatchController(config, source), source


@pytest.mark.parametrize(
    "kw",
    [
        {"min_util": 0.8, "max_util": 0.8},
        {"min_util": -0.1},
        {"max_util": 1.5},
        {"step_up": 0.0},
        {"step_down": 1.2},
        {"min_batch": 0},
        {"initial": 100},
        {"min_batch": 20, "initial": 16},
        {"interval_s": 0.0},
    ],
)
def test_config_rejects_bad_values(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        BatchPolicyConfig(**kw)  # type: ignore[arg-type]


def test_grows_20_percent_below_band_and_at_least_one() -> None:
    ctl, _ = controller(initial=10, value=0.3)
    assert ctl.update(0.0) == 12  # 10 * 1.2
    ctl2, _ = controller(initial=1, value=0.0)
    assert [ctl2.update(float(t)) for t in range(3)] == [2, 3, 4]  # +20% of 1..3 rounds to +0


def test_shrinks_10_percent_above_band_and_at_least_one() -> None:
    ctl, _ = controller(initial=30, value=0.95)
    assert ctl.update(0.0) == 27  # 30 * 0.9
    ctl2, _ = controller(initial=4, value=1.0)
    assert [ctl2.update(float(t)) for t in range(3)] == [3, 2, 1]


@pytest.mark.parametrize("util", [0.6, 0.7, 0.8, None])
def test_holds_inside_band_edges_included_and_without_data(util: float | None) -> None:
    ctl, _ = controller(initial=20, value=util)
    for t in range(5):
        assert ctl.update(float(t)) == 20
    assert ctl.stats().recent[-1].action == ("no_data" if util is None else "hold")


def test_bounds_are_respected() -> None:
    ctl, src = controller(initial=60, value=0.0, min_batch=4, max_batch=64)
    assert [ctl.update(float(t)) for t in range(3)] == [64, 64, 64]
    assert ctl.stats().recent[-1].action == "bound"
    src.set(1.0)
    limits = [ctl.update(float(t)) for t in range(40)]
    assert min(limits) == 4 and limits[-1] == 4
    assert all(4 <= n <= 64 for n in limits)


def test_evaluates_once_per_control_interval() -> None:
    ctl, src = controller(initial=10, value=0.1, interval_s=1.0)
    assert ctl.maybe_update(100.0) == 10  # the first call only starts the interval
    assert ctl.maybe_update(100.5) == 10
    assert src.num_reads == 0
    assert ctl.maybe_update(101.0) == 12
    assert ctl.maybe_update(101.9) == 12
    assert ctl.maybe_update(102.0) == 14
    assert ctl.maybe_update(150.0) == 17  # a stall gives one evaluation, not a burst
    assert ctl.maybe_update(150.5) == 17
    assert src.num_reads == 3 and ctl.stats().num_grows == 3


def test_set_batch_policy_takes_effect_on_the_next_interval() -> None:
    ctl, src = controller(initial=20, value=0.55, interval_s=1.0)
    ctl.maybe_update(0.0)
    assert ctl.maybe_update(1.0) == 24  # 0.55 < default min_util 0.6: grows by 20%
    ctl.set_batch_policy(0.5, 0.85, 0.15)
    assert ctl.limit == 24  # nothing changes between evaluations
    assert ctl.maybe_update(1.5) == 24
    assert ctl.maybe_update(2.0) == 24  # 0.55 is inside the new band: hold
    src.set(0.82)  # above the old max 0.8, inside the new 0.85
    assert ctl.maybe_update(3.0) == 24
    src.set(0.9)
    assert ctl.maybe_update(4.0) == 20  # 24 * (1 - 0.15) = 20.4
    src.set(0.3)
    assert ctl.maybe_update(5.0) == 23  # 20 * (1 + 0.15)
    cfg = ctl.stats().config
    assert (cfg.min_util, cfg.max_util, cfg.step_up, cfg.step_down) == (0.5, 0.85, 0.15, 0.15)


@pytest.mark.parametrize("args", [(0.9, 0.5, 0.1), (0.5, 1.1, 0.1), (0.5, 0.8, 0.0), (0.5, 0.8, 2)])
def test_set_batch_policy_rejects_bad_values_and_keeps_the_old(
    args: tuple[float, float, float],
) -> None:
    ctl, _ = controller()
    before = ctl.config
    with pytest.raises(InvalidRequestError):
        ctl.set_batch_policy(*args)
    assert ctl.config == before


def test_from_settings_maps_fields_and_clamps_initial() -> None:
    s = load_settings(
        max_num_seqs=8, min_util=0.5, max_util=0.9, step_up=0.3, control_interval_s=0.25
    )
    cfg = BatchPolicyConfig.from_settings(s)
    assert (cfg.min_batch, cfg.initial, cfg.max_batch) == (1, 8, 8)
    assert (cfg.min_util, cfg.max_util, cfg.step_up, cfg.step_down) == (0.5, 0.9, 0.3, 0.1)
    assert cfg.interval_s == 0.25
    assert AdaptiveBatchController.from_settings(s).limit == 8


class SyntheticWorkload:
    """Utilization rises with the batch: util = min(1, limit / knee) (+ optional noise)."""

    def __init__(self, knee: float, noise: float = 0.0, seed: int = 0) -> None:
        self.knee, self.noise, self.rng = knee, noise, random.Random(seed)
        self.ctl: AdaptiveBatchController | None = None

    def read(self) -> float:
        assert self.ctl is not None
        jitter = self.rng.uniform(-self.noise, self.noise)
        return min(1.0, max(0.0, self.ctl.limit / self.knee + jitter))


def run_virtual(ctl: AdaptiveBatchController, n: int, start: float = 0.0) -> list[float]:
    """n control intervals on a virtual clock from `start` (4 engine steps per interval); the
    utilizations all evaluations so far saw."""
    for step in range(n * 4 + 1):
        ctl.maybe_update(start + step * 0.25)
    return [d.utilization for d in ctl.stats().recent if d.utilization is not None]


@settings(max_examples=60, deadline=None)
@given(knee=st.integers(10, 60), initial=st.integers(1, 64))
def test_converges_into_band_and_stays(knee: int, initial: int) -> None:
    workload = SyntheticWorkload(knee)
    ctl = AdaptiveBatchController(BatchPolicyConfig(initial=initial, max_batch=64), workload)
    workload.ctl = ctl
    utils = run_virtual(ctl, 120)
    assert len(utils) == 120
    settled = utils[40:]  # 1 -> 36 takes 16 grows; 64 -> 48 a few shrinks
    assert all(0.6 <= u <= 0.8 for u in settled), settled
    assert len({d.new_limit for d in ctl.stats().recent[40:]}) == 1


def test_converges_under_noise_and_after_a_policy_change() -> None:
    workload = SyntheticWorkload(40, noise=0.03, seed=7)
    ctl = AdaptiveBatchController(BatchPolicyConfig(initial=16), workload)
    workload.ctl = ctl
    utils = run_virtual(ctl, 60)
    assert all(0.6 - 0.03 <= u <= 0.8 + 0.03 for u in utils[20:])
    ctl.set_batch_policy(0.3, 0.45, 0.15)
    run_virtual(ctl, 60, start=61.0)
    tail = [d.new_limit for d in ctl.stats().recent[-30:]]
    assert all(0.3 * 40 - 2 <= n <= 0.45 * 40 + 2 for n in tail), tail


def test_concurrent_policy_changes_and_updates_stay_consistent() -> None:
    ctl, src = controller(initial=16, value=0.1, max_batch=64)

    def admin() -> None:
        for i in range(200):
            ctl.set_batch_policy(0.2 + (i % 5) * 0.05, 0.9, 0.1 + (i % 3) * 0.05)

    thread = threading.Thread(target=admin)
    thread.start()
    for t in range(500):
        src.set((t % 10) / 10)
        ctl.update(float(t))
    thread.join()
    stats = ctl.stats()
    assert stats.num_updates == 500
    assert all(1 <= d.new_limit <= 64 for d in stats.recent)


def test_fake_source_is_a_utilization_source() -> None:
    src = FakeUtilization(script=[0.1, 1.7, float("nan"), -0.2])
    assert isinstance(src, UtilizationSource)
    assert [src.read() for _ in range(5)] == [0.1, 1.0, None, 0.0, 0.0]


class FixedDemand:
    def __init__(self, limit_binds: bool, num_seqs: int | None) -> None:
        self.value = Demand(limit_binds, num_seqs)

    def demand(self) -> Demand:
        return self.value


def test_holds_while_the_limit_does_not_bind_and_while_a_shrink_drains() -> None:
    source = FakeUtilization(0.1)
    demand = FixedDemand(limit_binds=False, num_seqs=3)
    ctl = AdaptiveBatchController(BatchPolicyConfig(initial=10), source, demand=demand)
    assert [ctl.update(float(t)) for t in range(3)] == [10, 10, 10]  # low u, nobody waiting
    assert ctl.stats().recent[-1].action == "idle" and ctl.stats().num_idle == 3
    demand.value = Demand(limit_binds=True, num_seqs=10)
    assert ctl.update(3.0) == 12  # now it binds: grow
    source.set(0.95)
    demand.value = Demand(limit_binds=True, num_seqs=14)  # the batch is still above the limit
    assert ctl.update(4.0) == 12 and ctl.stats().recent[-1].action == "draining"
    demand.value = Demand(limit_binds=True, num_seqs=12)  # it has caught up: shrink again
    assert ctl.update(5.0) == 11
    source.set(None)
    assert ctl.update(6.0) == 11 and ctl.stats().recent[-1].action == "no_data"
    assert ctl.stats().num_draining == 1
