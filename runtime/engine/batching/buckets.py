"""One bucket of the step-time model: the steps of about one size, as a few running numbers.

A bucket keeps two things of the steps that fell into it (a half-octave of the batch, in sampled
rows):
- the running mean of their work and wall time (the last ~`memory` steps): one measured point of
  the step-time curve, a knot, at the bucket's current mix;
- the exponentially weighted covariance of work and time over a longer memory: within one bucket
  the batch is about fixed, so what still moves the time there is the mix (prefill tokens joining,
  attention pairs as the context grows). Pooled over buckets these covariances give the marginal
  cost of a token and of an attention pair, whatever the shape of the curve over the batch
  (a "within" regression: each bucket's own level is taken out, so a saturating T(tokens) does
  not leak into the mix slopes).

A bucket changes only when a step of its size is observed: hours at one batch size leave every
other bucket where the warm-up sweep or earlier traffic put it (no drift by mere passing time).
"""

from __future__ import annotations

FEATURES = 3  # tokens, sampled rows, attention pairs (StepCost.features)


class Bucket:
    __slots__ = ("count", "cov_xx", "cov_xy", "features", "is_warm", "mean_x", "mean_y", "seconds")

    def __init__(self, *, skip_first: bool = True) -> None:
        # the first step of a new batch shape pays one-off costs: skipped
        self.is_warm = not skip_first
        self.count = 0
        self.features = [0.0] * FEATURES  # running mean of the work (the knot)
        self.seconds = 0.0  # running mean of the wall time (the knot)
        self.mean_x = [0.0] * FEATURES  # the covariances' own (longer-memory) means
        self.mean_y = 0.0
        self.cov_xx = [[0.0] * FEATURES for _ in range(FEATURES)]
        self.cov_xy = [0.0] * FEATURES

    def add(self, x: tuple[float, ...], seconds: float, memory: int, moment_memory: int) -> None:
        if not self.is_warm:  # (allocations, kernel choice: on CPU several times a warm step)
            self.is_warm = True
            return
        self.count += 1
        alpha = 1.0 / min(self.count, memory)
        for i in range(FEATURES):
            self.features[i] += alpha * (x[i] - self.features[i])
        self.seconds += alpha * (seconds - self.seconds)
        # exponentially weighted (co)variance, West's update: exact for the first steps (alpha =
        # 1/count is the plain mean), then forgetting with weight 1/moment_memory per step
        beta = 1.0 / min(self.count, moment_memory)
        dx = [x[i] - self.mean_x[i] for i in range(FEATURES)]
        dy = seconds - self.mean_y
        for i in range(FEATURES):
            self.mean_x[i] += beta * dx[i]
            for k in range(FEATURES):
                self.cov_xx[i][k] = (1 - beta) * (self.cov_xx[i][k] + beta * dx[i] * dx[k])
            self.cov_xy[i] = (1 - beta) * (self.cov_xy[i] + beta * dx[i] * dy)
        self.mean_y += beta * dy

    def weight(self, moment_memory: int) -> float:
        """How many steps the covariances stand for (their share in the pooled estimate)."""
        return float(min(self.count, moment_memory))
