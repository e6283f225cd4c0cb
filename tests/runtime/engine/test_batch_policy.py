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
    ("kw", "param", "message"),
    [
        ({"min_util": 0.8, "max_util": 0.8}, "min_util", "need 0 <= min_util < max_util <= 1"),
        ({"min_util": -0.1}, "min_util", "got -0.1, 0.8"),
        ({"max_util": 1.5}, "min_util", "got 0.6, 1.5"),
        ({"step_up": 0.0}, "step_up", "step_up must be in (0, 1], got 0.0"),
        ({"step_down": 1.2}, "step_down", "step_down must be in (0, 1], got 1.2"),
        ({"min_batch": 0}, "initial", "need 1 <= min_batch <= initial <= max_batch, got 0, 16"),
        ({"initial": 100}, "initial", "got 1, 100, 64"),
        ({"min_batch": 20, "initial": 16}, "initial", "got 20, 16, 64"),
        ({"interval_s": 0.0}, "interval_s", "interval_s must be > 0, got 0.0"),
    ],
)
def test_config_rejects_bad_values_naming_the_setting(
    kw: dict[str, float], param: str, message: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        BatchPolicyConfig(**kw)  # type: ignore[arg-type]
    assert exc.value.param == param
    assert message in exc.value.message


@pytest.mark.parametrize(
    "kw",
    [
        {"min_util": 0.0},  # the band's edges are allowed
        {"max_util": 1.0},
        {"step_up": 1.0, "step_down": 1.0},  # a step of 100% is allowed
        {"min_batch": 16, "initial": 16, "max_batch": 16},
    ],
)
def test_config_accepts_the_edges(kw: dict[str, float]) -> None:
    BatchPolicyConfig(**kw)  # type: ignore[arg-type]
    AdaptiveBatchController(BatchPolicyConfig()).set_batch_policy(
        kw.get("min_util", 0.6), kw.get("max_util", 0.8), kw.get("step_up", 0.1)
    )


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


# Every step of the law from the default bounds, worked by hand: shrink is round-half-up of
# limit * 0.9 (64 -> 57.6 -> 58, 25 -> 22.5 -> 23, 15 -> 13.5 -> 14), at least one less; grow is
# round-half-up of limit * 1.2, at least one more. Rounding down, to even, or a different step
# shows up as a different sequence.
SHRINK_FROM_64 = [58, 52, 47, 42, 38, 34, 31, 28, 25, 23, 21, 19, 17, 15, 14, 13, 12, 11, 10, 9]
SHRINK_FROM_64 += [8, 7, 6, 5, 4, 3, 2, 1]
GROW_FROM_1 = [2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 17, 20, 24, 29, 35, 42, 50, 60, 64]


def test_shrink_steps_round_to_nearest_from_the_top_to_the_floor() -> None:
    ctl, _ = controller(initial=64, value=1.0, max_batch=64)
    limits = [ctl.update(float(t)) for t in range(len(SHRINK_FROM_64) + 1)]
    assert limits == [*SHRINK_FROM_64, 1]
    actions = [d.action for d in ctl.stats().recent]
    assert actions == ["shrink"] * len(SHRINK_FROM_64) + ["bound"]


def test_grow_steps_round_to_nearest_from_the_floor_to_the_top() -> None:
    ctl, _ = controller(initial=1, value=0.0, max_batch=64)
    limits = [ctl.update(float(t)) for t in range(len(GROW_FROM_1) + 1)]
    assert limits == [*GROW_FROM_1, 64]
    actions = [d.action for d in ctl.stats().recent]
    assert actions == ["grow"] * len(GROW_FROM_1) + ["bound"]


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


@pytest.mark.parametrize(
    ("args", "param"),
    [
        ((0.9, 0.5, 0.1), "min_util"),
        ((0.5, 1.1, 0.1), "min_util"),
        ((0.5, 0.8, 0.0), "step_size"),
        ((0.5, 0.8, 2), "step_size"),
    ],
)
def test_set_batch_policy_rejects_bad_values_and_keeps_the_old(
    args: tuple[float, float, float], param: str
) -> None:
    ctl, _ = controller()
    before = ctl.config
    with pytest.raises(InvalidRequestError) as exc:
        ctl.set_batch_policy(*args)
    assert exc.value.param == param  # the admin endpoint's 400 names it
    assert ctl.config == before


def test_evaluations_keep_the_grid_and_the_decision_records_what_it_saw() -> None:
    ctl, src = controller(initial=10, value=0.1, interval_s=1.0)
    ctl.maybe_update(100.0)
    assert ctl.maybe_update(101.5) == 12  # late inside the interval: the grid stays 102, 103
    assert ctl.maybe_update(102.0) == 14
    src.set(0.7)
    assert ctl.maybe_update(104.0) == 14  # exactly one interval late: restart from 104
    assert src.num_reads == 3
    ctl.maybe_update(104.0)  # ... so a second call at the same instant does not evaluate
    assert ctl.maybe_update(104.9) == 14 and src.num_reads == 3
    ctl.maybe_update(105.0)
    assert src.num_reads == 4
    assert ctl.maybe_update(150.0) == 14  # a stall: one evaluation, the grid restarts at 151
    assert ctl.maybe_update(151.0) == 14 and src.num_reads == 6
    decision = ctl.stats().recent[0]
    assert (decision.ts, decision.utilization, decision.old_limit) == (101.5, 0.1, 10)
    assert (decision.new_limit, decision.action) == (12, "grow")
    assert ctl.stats().recent[-1].ts == 151.0


def test_the_clock_times_calls_without_now() -> None:
    now = [5.0]
    src = FakeUtilization(0.1)
    ctl = AdaptiveBatchController(BatchPolicyConfig(initial=10), src, clock=lambda: now[0])
    ctl.maybe_update()
    now[0] = 6.0
    assert ctl.maybe_update() == 12
    now[0] = 6.5
    assert ctl.update() == 14
    assert [d.ts for d in ctl.stats().recent] == [6.0, 6.5]


def test_stats_count_every_kind_of_decision() -> None:
    ctl, src = controller(initial=2, value=None, min_batch=1, max_batch=4)
    assert ctl.stats().last_utilization is None and ctl.stats().num_updates == 0
    script = [None, 0.1, 0.1, 0.1, 0.7, 0.95, 0.95, 0.95, 0.95]  # no_data, 3 up, hold, 4 down
    for t, u in enumerate(script):
        src.set(u)
        ctl.update(float(t))
    stats = ctl.stats()
    assert [d.action for d in stats.recent] == [
        *["no_data", "grow", "grow", "bound", "hold"],
        *["shrink", "shrink", "shrink", "bound"],
    ]
    assert (stats.limit, stats.num_updates, stats.num_grows, stats.num_shrinks) == (1, 9, 2, 3)
    assert (stats.num_holds, stats.num_no_data, stats.last_utilization) == (3, 1, 0.95)


def test_history_keeps_the_newest_256_decisions() -> None:
    ctl, _ = controller(initial=10, value=0.7)
    for t in range(300):
        ctl.update(float(t))
    recent = ctl.stats().recent
    assert len(recent) == 256 and recent[0].ts == 44.0 and recent[-1].ts == 299.0
    assert ctl.stats().num_updates == 300


def test_from_settings_maps_fields_and_clamps_initial() -> None:
    s = load_settings(
        max_num_seqs=8, min_util=0.5, max_util=0.9, step_up=0.3, control_interval_s=0.25
    )
    cfg = BatchPolicyConfig.from_settings(s)
    assert (cfg.min_batch, cfg.initial, cfg.max_batch) == (1, 8, 8)
    assert (cfg.min_util, cfg.max_util, cfg.step_up, cfg.step_down) == (0.5, 0.9, 0.3, 0.1)
    assert cfg.interval_s == 0.25
    assert AdaptiveBatchController.from_settings(s).limit == 8
    s2 = load_settings(max_num_seqs=32, min_num_seqs=2, initial_num_seqs=4, step_down=0.3)
    cfg2 = BatchPolicyConfig.from_settings(s2, max_batch=6)  # the engine's token-budget cap
    assert (cfg2.min_batch, cfg2.initial, cfg2.max_batch, cfg2.step_down) == (2, 4, 6, 0.3)
    src = FakeUtilization(0.1)
    ctl = AdaptiveBatchController.from_settings(s2, src, clock=lambda: 7.0)
    assert ctl.source is src and ctl.update() == 5 and ctl.stats().recent[-1].ts == 7.0


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
    def __init__(
        self,
        limit_binds: bool,
        num_seqs: int | None,
        queue_wait_s: float | None = None,
        num_waiting: int | None = None,
    ) -> None:
        self.value = Demand(limit_binds, num_seqs, queue_wait_s, num_waiting)

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


def test_a_long_queue_wait_grows_the_limit_past_the_band() -> None:
    source = FakeUtilization(0.7)  # inside the balanced band: the law alone holds
    demand = FixedDemand(limit_binds=True, num_seqs=8, queue_wait_s=0.5)
    config = BatchPolicyConfig(initial=8, max_batch=12, max_queue_wait_s=1.0)
    ctl = AdaptiveBatchController(config, source, demand=demand)
    assert ctl.update(0.0) == 8 and ctl.stats().recent[-1].action == "hold"  # waited 0.5 s: fine
    demand.value = Demand(limit_binds=True, num_seqs=8, queue_wait_s=3.0)
    assert ctl.update(1.0) == 10 and ctl.stats().recent[-1].action == "queue"  # +20%
    source.set(0.95)  # above the band: the law would shrink, the wait wins
    demand.value = Demand(limit_binds=True, num_seqs=10, queue_wait_s=2.0)
    assert ctl.update(2.0) == 12 and ctl.stats().recent[-1].action == "queue"
    assert ctl.update(3.0) == 12 and ctl.stats().recent[-1].action == "bound"  # at max_batch
    demand.value = Demand(limit_binds=False, num_seqs=12, queue_wait_s=0.0)
    assert ctl.update(4.0) == 12 and ctl.stats().recent[-1].action == "idle"  # nobody waits
    demand.value = Demand(limit_binds=True, num_seqs=12, queue_wait_s=0.2)
    assert ctl.update(5.0) == 11 and ctl.stats().recent[-1].action == "shrink"  # short waits
    assert ctl.stats().num_queue_grows == 2


def test_a_queue_grow_makes_room_for_every_request_waiting() -> None:
    """A burst: 32 requests on a limit of 16. One queue grow admits the 16 left waiting instead
    of +20% a second; never past max_batch; a short queue still grows by step_up at least."""
    source = FakeUtilization(0.9)
    demand = FixedDemand(limit_binds=True, num_seqs=16, queue_wait_s=1.5, num_waiting=16)
    config = BatchPolicyConfig(initial=16, max_batch=64, max_util=0.95, max_queue_wait_s=1.0)
    ctl = AdaptiveBatchController(config, source, demand=demand)
    assert ctl.update(0.0) == 32 and ctl.stats().recent[-1].action == "queue"
    demand.value = Demand(limit_binds=True, num_seqs=32, queue_wait_s=1.5, num_waiting=1)
    assert ctl.update(1.0) == 38  # one waiting: +20% all the same
    demand.value = Demand(limit_binds=True, num_seqs=38, queue_wait_s=1.5, num_waiting=500)
    assert ctl.update(2.0) == 64  # an overload: at the cap
    assert ctl.stats().num_queue_grows == 3
    # below the band the law grows +20% too: the queue's room wins when it is more
    low = AdaptiveBatchController(
        config,
        FakeUtilization(0.3),
        demand=FixedDemand(limit_binds=True, num_seqs=16, queue_wait_s=1.5, num_waiting=16),
    )
    assert low.update(0.0) == 32 and low.stats().recent[-1].action == "queue"
    low_short = AdaptiveBatchController(
        config,
        FakeUtilization(0.3),
        demand=FixedDemand(limit_binds=True, num_seqs=16, queue_wait_s=0.5, num_waiting=16),
    )
    assert low_short.update(0.0) == 19 and low_short.stats().recent[-1].action == "grow"


def test_the_queue_term_is_off_at_zero_and_off_without_a_wait() -> None:
    for config, wait in (
        (BatchPolicyConfig(initial=8), 60.0),
        (BatchPolicyConfig(initial=8, max_queue_wait_s=1.0), None),
    ):
        demand = FixedDemand(limit_binds=True, num_seqs=8, queue_wait_s=wait)
        ctl = AdaptiveBatchController(config, FakeUtilization(0.95), demand=demand)
        assert ctl.update(0.0) == 7 and ctl.stats().num_queue_grows == 0  # the band's shrink
    with pytest.raises(ConfigError, match="max_queue_wait_s"):
        BatchPolicyConfig(max_queue_wait_s=-1.0)
