"""The properties the batch controller and its signal must have (issue: adaptive batching that
helps), each on a synthetic device: a scripted step-time model driven by a simulated engine loop
on a virtual clock (tests/runtime/engine/synthetic_device.py). Nothing sleeps."""

from __future__ import annotations

import itertools
import statistics
import subprocess
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.engine.batching.controller import BatchPolicyConfig, next_limit
from tests.conftest import require_binary
from tests.runtime.engine.synthetic_device import ScriptedDevice, SimulatedEngine

AFFINE = ScriptedDevice(fixed_s=0.010, per_token_s=0.001)  # knee at 10 tokens per step
RULES = Path(__file__).resolve().parents[3] / "alerts/rules/fastllm.rules.yml"


def steady(sim: SimulatedEngine, seconds: float) -> list:
    """The decisions of the last `seconds` of virtual time."""
    return sim.decisions(since=sim.now - seconds)


def one_step_apart(limits: list[int], config: BatchPolicyConfig) -> bool:
    """At most two limit values, and each one law step from the other (back and forth)."""
    values = sorted(set(limits))
    if len(values) == 1:
        return True
    lo, hi = values
    up = next_limit(lo, 0.0, config)[0]
    down = next_limit(hi, 1.0, config)[0]
    return len(values) == 2 and (up == hi or down == lo)


def test_1_u_rises_with_the_limit_under_a_saturating_load() -> None:
    medians, truths = [], []
    for limit in (1, 2, 4, 8, 16, 32, 64):
        pinned = BatchPolicyConfig(initial=limit, min_batch=limit, max_batch=limit)
        sim = SimulatedEngine(AFFINE, pinned, streams=128)
        sim.run(12.0)
        medians.append(statistics.median(d.utilization for d in steady(sim, 6.0)))
        steps = [s for s in sim.steps if s.ts > sim.now - 6.0]
        rows = sum(s.num_sampled for s in steps)
        per_seq = (sum(s.num_decode_tokens for s in steps) / rows, 1.0, 0.0)
        busy = sum(s.busy_seconds for s in steps) / 6.0
        # the truth: tokens/s at this limit ÷ at the best limit (64), for the same work
        truths.append(busy * AFFINE.true_ratio(per_seq, limit, 64))
    assert all(b > a for a, b in itertools.pairwise(medians)), medians
    assert medians[0] < 0.2 and medians[-1] > 0.9
    for got, want in zip(medians, truths, strict=True):  # and it is what it claims to be (±0.1)
        assert abs(got - want) <= 0.1, (medians, truths)


@settings(
    max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    fixed_ms=st.floats(2.0, 20.0),
    knee=st.floats(2.0, 12.0),
    initial=st.sampled_from([1, 64]) | st.integers(1, 64),
    noise=st.sampled_from([0.0, 0.05]),
)
def test_2_with_a_backlog_the_limit_settles_in_the_band_and_stays(
    fixed_ms: float, knee: float, initial: int, noise: float
) -> None:
    device = ScriptedDevice(fixed_ms / 1e3, fixed_ms / 1e3 / knee, noise=noise)
    config = BatchPolicyConfig(initial=initial, interval_s=0.5)
    sim = SimulatedEngine(device, config, streams=96, seed=int(fixed_ms * 1000))
    # settling takes steps, not seconds: from 64 the batch shrinks only as sequences finish
    # (48 to 80 steps each), and on a slow device (0.5 s steps at 64) that alone takes ~60 s
    sim.run(90.0 + 200 * device.mean_seconds(64, 64, 64))
    tail = steady(sim, 15.0)
    utils = [d.utilization for d in tail]
    assert config.min_util <= statistics.median(utils) <= config.max_util, utils
    assert all(config.min_util - 0.03 <= u <= config.max_util + 0.03 for u in utils), utils
    assert one_step_apart([d.new_limit for d in tail], config), [d.new_limit for d in tail]
    # a backlog alone never drives the limit to the minimum once the signal has settled
    assert min(d.new_limit for d in tail) > config.min_batch


def test_3_the_controller_holds_while_the_limit_does_not_bind() -> None:
    config = BatchPolicyConfig(initial=16)
    light = SimulatedEngine(AFFINE, config, streams=6)  # 6 running, limit 16, nothing waits
    light.run(60.0)
    decisions = light.decisions()
    assert {d.new_limit for d in decisions} == {16}
    assert {d.action for d in decisions} == {"idle"}
    reading = light.source.reading()  # the exported ratio still reports u
    assert reading.utilization is not None and 0.2 < reading.utilization < 0.6
    idle = SimulatedEngine(AFFINE, config, streams=0)  # no load at all
    idle.run(60.0)
    assert {d.new_limit for d in idle.decisions()} == {16}
    assert idle.source.read() == 0.0
    # open-loop Poisson arrivals at half the saturating throughput: no ratchet either way
    pinned = SimulatedEngine(AFFINE, BatchPolicyConfig(initial=64, min_batch=64), streams=128)
    pinned.run(10.0)
    rate = 0.5 * pinned.tokens_per_s(since=5.0) / 64  # requests/s (64 new tokens on average)
    poisson = SimulatedEngine(AFFINE, config, streams=0, arrival_rate=rate, seed=3)
    poisson.run(120.0)
    limits = [d.new_limit for d in poisson.decisions()]
    assert max(limits) - min(limits) <= 4, limits


def test_4_no_data_or_too_little_spread_holds() -> None:
    config = BatchPolicyConfig(initial=16)
    sim = SimulatedEngine(AFFINE, config, streams=0, warmup=False)
    for t in range(1, 20):
        sim.controller.maybe_update(float(t))
    assert {d.action for d in sim.decisions()} == {"no_data"} and sim.controller.limit == 16
    # a saturating load whose steps all have 8 or 11 tokens: two buckets 1.4x apart
    narrow = SimulatedEngine(AFFINE, config, streams=0, warmup=False)
    narrow.controller.maybe_update(0.0)
    for i in range(2000):
        narrow._observe(8 if i % 2 else 11, 8, 800, limit=16, binds=True)
        narrow.controller.maybe_update(narrow.now)
    assert narrow.source.model.fit() is None
    assert {d.action for d in narrow.decisions()} == {"no_data"} and narrow.controller.limit == 16


def low_alert_fires(values: list[float], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """promtool evaluates the project's rules over these 15 s samples of the ratio."""
    series = 'fastllm_device_utilization_ratio{device="cpu",instance="rt:8000",job="fastllm"}'
    encoded = " ".join(f"{v:.4f}" for v in values)
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": series, "values": encoded}],
                "promql_expr_test": [
                    {
                        "expr": 'ALERTS{alertname="FastllmDeviceUtilizationLow"}',
                        "eval_time": f"{15 * (len(values) - 1)}s",
                        "exp_samples": [
                            {
                                "labels": 'ALERTS{alertname="FastllmDeviceUtilizationLow",'
                                'alertstate="firing",device="cpu",instance="rt:8000",'
                                'job="fastllm",severity="warning"}',
                                "value": 1,
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "flat.test.yml"
    path.write_text(yaml.safe_dump(test))
    promtool = require_binary("promtool")
    return subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )


def test_5_a_flat_step_time_pins_the_limit_at_max_and_the_low_alert_is_true(
    tmp_path: Path,
) -> None:
    flat = ScriptedDevice(fixed_s=0.050, per_token_s=0.0)  # 1 row costs what 64 rows cost
    config = BatchPolicyConfig(initial=4, max_batch=64)
    sim = SimulatedEngine(flat, config, streams=128)
    samples: list[float] = []
    for _ in range(26):  # 6.5 minutes, the ratio scraped every 15 s
        sim.run(15.0)
        samples.append(sim.source.read() or 0.0)
    late = [d for d in sim.decisions() if d.ts > 60.0]
    assert {d.new_limit for d in late} == {64}
    assert max(samples[4:]) < 0.5
    result = low_alert_fires(samples, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # the check is live: the same harness fails when the ratio is inside the band
    assert low_alert_fires([0.75] * len(samples), tmp_path).returncode != 0


def test_6_the_trade_off_is_documented_where_operators_look() -> None:
    from runtime.config import Settings

    root = Path(__file__).resolve().parents[3]
    help_text = Settings.model_fields["max_util"].description or ""
    assert "throughput" in help_text and "latency" in help_text
    # max_util alone does not buy throughput (u inside the band holds): the help says so
    assert "batch_goal throughput" in help_text and "min_util" in help_text
    goal_help = Settings.model_fields["batch_goal"].description or ""
    assert all(goal in goal_help for goal in ("latency", "balanced", "throughput"))
    batching = (root / "docs/batching.md").read_text()
    runbooks = (root / "docs/runbooks.md").read_text()
    assert "`max_util` alone sets only the upper edge" in batching
    for text in (batching, runbooks):
        assert "batch_goal: throughput" in text
    assert "flat" in runbooks.split("## FastllmDeviceUtilizationLow")[1].split("\n## ")[0]


def test_set_batch_policy_takes_effect_at_the_next_interval() -> None:
    config = BatchPolicyConfig(initial=48)  # starts far above the knee: shrinks
    sim = SimulatedEngine(AFFINE, config, streams=96)
    # (no_data until the size has a step measured: its first, one big prefill, is skipped)
    while not [d for d in sim.decisions() if d.action != "no_data"]:
        sim.step()
    first = sim.decisions()[-1]
    assert first.action == "shrink" and first.new_limit == 43  # the default 10%
    sim.controller.set_batch_policy(0.5, 0.85, 0.15)
    seen = len(sim.decisions())
    while len(sim.decisions()) == seen:
        assert sim.controller.limit == 43  # nothing moves between evaluations
        sim.step()
    while len(sim.decisions()) < seen + 40:
        sim.step()
    after = sim.decisions()[seen:]
    # while the batch drains down to 43 the law waits; its next shrink is the new 15%
    moves = [d for d in after if d.action != "draining"]
    assert moves[0].action == "shrink" and moves[0].new_limit == round(43 * 0.85)
    # and a reading between the old and the new max_util (0.8, 0.85] now holds
    assert any(d.action == "hold" and 0.8 < (d.utilization or 0) <= 0.85 for d in after), after
    sim.run(60.0)
    tail = steady(sim, 15.0)
    assert 0.5 <= statistics.median(d.utilization for d in tail) <= 0.85
    assert sim.controller.config.step_up == sim.controller.config.step_down == 0.15
