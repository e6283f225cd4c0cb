"""u over the whole batch range (issue 28), on the synthetic device with a saturating step time
(flat while reading the weights dominates, then linear: the shape a CPU or a GPU shows) and a
context that grows over the run: at every pinned batch u reads the true ratio tokens/s(batch) ÷
tokens/s(best batch) for the same work (±0.1), also after a long run at one batch size.

The truth is the device's own formula (ScriptedDevice.true_ratio) at the work per sequence the
engine ran in the last second, times the measured busy fraction; nothing of the model is in it.
"""

from __future__ import annotations

from runtime.engine.batching.controller import AdaptiveBatchController, BatchPolicyConfig
from tests.runtime.engine.synthetic_device import ScriptedDevice, SimulatedEngine

# knee at 30 tokens; a sampled row and an attention pair cost something too (lm_head, scores)
DEVICE = ScriptedDevice(
    fixed_s=0.030, per_token_s=0.001, per_row_s=0.0002, per_pair_s=4e-7, noise=0.05, saturating=True
)
MAX_BATCH = 64
SIZES = (1, 4, 8, 16, 24, 32, 48, 64)


def pin(sim: SimulatedEngine, limit: int) -> None:
    """Pin the running engine's limit (a new controller on the same signal and model); sequences
    beyond it go back to the queue (preempted), so the batch is `limit` from the next step."""
    config = BatchPolicyConfig(initial=limit, min_batch=limit, max_batch=limit)
    sim.controller = AdaptiveBatchController(config, sim.source, history=100_000)
    sim.waiting += max(0, len(sim.running) - limit)
    sim.running = sim.running[:limit]


def u_and_truth(sim: SimulatedEngine, limit: int) -> tuple[float, float]:
    reading = sim.source.reading()
    steps = [s for s in sim.steps if s.ts > sim.now - 1.0]
    rows = sum(s.num_sampled for s in steps)
    per_seq = (
        sum(s.num_decode_tokens for s in steps) / rows,
        1.0,
        sum(s.num_attention_pairs for s in steps) / rows,
    )
    assert reading.utilization is not None and reading.busy_fraction is not None
    truth = reading.busy_fraction * DEVICE.true_ratio(per_seq, limit, MAX_BATCH)
    return reading.utilization, truth


def engine(limit: int) -> SimulatedEngine:
    """Long generations: the context grows from 40 to hundreds of tokens over the run."""
    sim = SimulatedEngine(
        DEVICE,
        BatchPolicyConfig(initial=limit, min_batch=1, max_batch=MAX_BATCH),
        streams=2 * MAX_BATCH,
        new_tokens=(600, 1200),
    )
    pin(sim, limit)
    return sim


def test_u_reads_the_true_ratio_at_every_pinned_batch_as_the_context_grows() -> None:
    for limit in SIZES:
        sim = engine(limit)
        contexts = []
        for _ in range(4):
            sim.run(4.0)
            u, truth = u_and_truth(sim, limit)
            assert abs(u - truth) <= 0.1, (limit, sim.now, u, truth)
            contexts.append(sim.steps[-1].num_attention_pairs / sim.steps[-1].num_sampled)
            if limit >= 32:  # past the knee: the device is saturated, and u says so
                assert u > 0.9, (limit, u)
        assert contexts[-1] > 1.5 * contexts[0]  # the context did grow over the run


def test_no_drift_after_a_long_run_at_one_batch_size() -> None:
    sim = engine(32)
    readings = []
    for _ in range(20):  # 10 virtual minutes at 32: contexts grow into the thousands
        sim.run(30.0)
        u, truth = u_and_truth(sim, 32)
        readings.append(u)
        assert abs(u - truth) <= 0.1, (sim.now, u, truth)
    assert max(readings) - min(readings) < 0.1, readings
    for limit in SIZES:  # then every other size: the buckets kept what they measured
        pin(sim, limit)
        sim.run(6.0)  # a knot is the mean of its last 32 steps: u follows a new size that fast
        u, truth = u_and_truth(sim, limit)
        assert abs(u - truth) <= 0.1, (limit, u, truth)


def test_a_device_idle_half_the_time_reads_half_at_most() -> None:
    """Busy half of every second at the best batch, idle the other half: u = busy x share reads
    ~0.5 (the low-utilization alert also looks at the busy ratio for this case)."""
    sim = engine(48)
    sim.run(6.0)
    sim.running, sim.waiting = [], 0  # the load goes away; steps are scripted below
    for _ in range(10):
        start = sim.now
        while sim.now < start + 0.5:  # a busy half second at 48 sequences, context 300
            sim._observe(48, 48, 48 * 300, 48, True)
        sim.now = start + 1.0
    reading = sim.source.reading()
    assert reading.busy_fraction is not None and abs(reading.busy_fraction - 0.5) < 0.1
    assert reading.utilization is not None and 0.4 <= reading.utilization <= 0.55
