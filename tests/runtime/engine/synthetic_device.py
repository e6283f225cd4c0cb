"""A synthetic device for the batch-controller property tests: a scripted step-time model and a
simulated engine loop on a virtual clock (nothing sleeps, no torch).

The simulator does what the engine does to the controller: every step it asks for the limit
(`maybe_update(now)`), schedules up to the limit (running sequences decode one token, new ones
prefill their whole prompt), "runs" the step for the scripted wall time, and hands the controller
the same StepStats fields the real engine emits (busy seconds, tokens, sampled rows, attention
pairs, whether the limit bound). Load is closed-loop streams (a finished request is resubmitted at
once) or open-loop Poisson arrivals.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from runtime.engine.batching.controller import (
    AdaptiveBatchController,
    BatchPolicyConfig,
    ThroughputUtilization,
)
from runtime.engine.batching.step_model import StepTimeModel
from runtime.engine.batching.warmup import WarmupPlan
from runtime.engine.stats import StepStats


@dataclass(frozen=True)
class ScriptedDevice:
    """T = fixed + per_token * tokens + per_row * sampled + per_pair * pairs, times (1 + noise);
    `saturating`: max(fixed, per_token * tokens) in place of the first two terms, the shape a CPU
    or a GPU shows (flat while reading the weights dominates, then linear in the rows)."""

    fixed_s: float = 0.010
    per_token_s: float = 0.001
    per_row_s: float = 0.0
    per_pair_s: float = 0.0
    noise: float = 0.0  # relative, uniform in [-noise, noise]
    saturating: bool = False

    def mean_seconds(self, tokens: float, sampled: float, pairs: float) -> float:
        gemm = self.per_token_s * tokens
        body = max(self.fixed_s, gemm) if self.saturating else self.fixed_s + gemm
        return body + self.per_row_s * sampled + self.per_pair_s * pairs

    def seconds(self, tokens: int, sampled: int, pairs: int, rng: random.Random) -> float:
        base = self.mean_seconds(tokens, sampled, pairs)
        return base * (1.0 + rng.uniform(-self.noise, self.noise))

    def true_ratio(
        self, per_seq: tuple[float, float, float], batch: float, max_batch: int
    ) -> float:
        """The truth u estimates at a busy device: tokens/s at `batch` sequences ÷ tokens/s at the
        best batch of 1..max_batch, for the same work per sequence (the same workload)."""

        def rate(n: float) -> float:
            work = [n * x for x in per_seq]
            return work[0] / self.mean_seconds(*work)

        return rate(batch) / max(rate(m) for m in range(1, max_batch + 1))

    def saturation_share(self, tokens: float, sampled: float, pairs: float) -> float:
        """The truth the signal estimates: 1 - fixed / T at this (mean) work."""
        variable = self.per_token_s * tokens + self.per_row_s * sampled + self.per_pair_s * pairs
        return variable / (self.fixed_s + variable)


@dataclass
class _Seq:
    prompt: int
    remaining: int  # tokens still to generate
    context: int = 0  # tokens whose KV exists


@dataclass
class SimulatedEngine:
    device: ScriptedDevice
    config: BatchPolicyConfig
    streams: int = 64  # closed-loop clients (0: none)
    arrival_rate: float = 0.0  # open-loop Poisson arrivals per second (on top of the streams)
    prompt_tokens: int = 40
    new_tokens: tuple[int, int] = (48, 80)  # per request, uniform: finishes spread out
    gap_s: float = 0.0005  # loop overhead between steps (not busy)
    token_budget: int = 2048  # per step, as max_num_batched_tokens (a prompt is never split here)
    window_intervals: float = 1.0  # the signal's window, in control intervals (as the engine)
    idle_wait_s: float = 0.05
    warmup: bool = True
    seed: int = 0
    now: float = 0.0
    rng: random.Random = field(init=False)
    source: ThroughputUtilization = field(init=False)
    controller: AdaptiveBatchController = field(init=False)
    waiting: int = field(init=False)
    running: list[_Seq] = field(default_factory=list)
    steps: list[StepStats] = field(default_factory=list)
    num_generated: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        model = StepTimeModel(skip_first=0)
        self.source = ThroughputUtilization(
            model, window_s=self.window_intervals * self.config.interval_s, clock=lambda: self.now
        )
        self.controller = AdaptiveBatchController(self.config, self.source, history=100_000)
        self.waiting = self.streams
        self._next_arrival = self._draw_arrival()
        if self.warmup:
            self._warm_up()

    def _draw_arrival(self) -> float:
        if self.arrival_rate <= 0:
            return float("inf")
        return self.now + self.rng.expovariate(self.arrival_rate)

    def _warm_up(self) -> None:
        """The engine's load-time sweep: the same plan, through the device, before any load."""
        plan = WarmupPlan.for_engine(self.config.max_batch)
        for size in plan.batch_sizes:
            self._observe(size * plan.prompt_tokens, size, size * plan.prompt_tokens, size, False)
            for k in range(plan.new_tokens - 1):
                self._observe(size, size, size * (plan.prompt_tokens + k + 1), size, False)
        self.source.model.seal_warmup()  # as run_warmup does

    def _observe(self, tokens: int, sampled: int, pairs: int, limit: int, binds: bool) -> float:
        seconds = self.device.seconds(tokens, sampled, pairs, self.rng)
        self.now += seconds
        step = StepStats(
            ts=self.now,
            step_id=len(self.steps) + 1,
            num_seqs=sampled,
            num_prefill_tokens=0,
            num_decode_tokens=tokens,
            busy_seconds=seconds,
            num_running=len(self.running),
            num_waiting=self.waiting,
            batch_size_limit=limit,
            num_sampled=sampled,
            num_attention_pairs=pairs,
            limit_binds=binds,
        )
        self.steps.append(step)
        self.controller.observe(step)
        return seconds

    def _arrivals_until(self, t: float) -> None:
        while self._next_arrival <= t:
            self.waiting += 1
            self._next_arrival = self._draw_arrival()

    def step(self) -> None:
        limit = self.controller.maybe_update(self.now)
        self._arrivals_until(self.now)
        joined: list[_Seq] = []
        budget = self.token_budget - len(self.running)
        while self.waiting > 0 and len(self.running) + len(joined) < limit:
            if budget < self.prompt_tokens:
                break
            budget -= self.prompt_tokens
            self.waiting -= 1
            joined.append(_Seq(self.prompt_tokens, self.rng.randint(*self.new_tokens)))
        if not self.running and not joined:
            self.now += self.idle_wait_s  # idle: the loop sleeps, nothing is busy
            return
        binds = self.waiting > 0 and len(self.running) + len(joined) >= limit
        tokens = len(self.running) + sum(s.prompt for s in joined)
        pairs = sum(s.context + 1 for s in self.running)
        pairs += sum(s.prompt * (s.prompt + 1) // 2 for s in joined)
        self._observe(tokens, len(self.running) + len(joined), pairs, limit, binds)
        for s in self.running:
            s.context += 1
        for s in joined:
            s.context = s.prompt
        self.running += joined
        for s in self.running:
            s.remaining -= 1
        self.num_generated += len(self.running)
        finished = [s for s in self.running if s.remaining <= 0]
        self.running = [s for s in self.running if s.remaining > 0]
        self.waiting += len(finished) if self.streams else 0  # closed loop: resubmit at once
        self.now += self.gap_s

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.step()

    # --- what the tests look at ------------------------------------------------------------------
    def decisions(self, since: float = 0.0) -> list:
        return [d for d in self.controller.stats().recent if d.ts >= since]

    def tokens_per_s(self, since: float) -> float:
        steps = [s for s in self.steps if s.ts >= since]
        return sum(s.num_sampled for s in steps) / max(self.now - since, 1e-9)
