"""The step-time curve the model fits, and the saturation share read off it.

A device's step time against the tokens in a step is not affine: a CPU's or a GPU's GEMMs cost
about the same for 1 to n* rows (reading the weights dominates), then grow about linearly (the
arithmetic dominates): T(n) ~ max(t0, c*n), with a soft knee. An affine fit a + b*n through such
points puts `a` near t0 and `b` well below c, so its saturation throughput 1/b is far above what
any batch delivers, and 1 - a/T reads ~0.5 at the very batch that saturates the device (issue 28).
So the curve here is the measured one: one knot per bucket (the mean work and time of its steps),
linear between knots, and the saturation throughput is the best throughput any knot delivers,
measured, not extrapolated. Knots measured at another mix (the warm-up's short prompts, a context
that has grown since) are first moved to the queried mix with the within-bucket marginal costs of
a sampled row and of an attention pair (runtime.engine.batching.buckets).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

Features = tuple[float, float, float]  # tokens, sampled rows, attention pairs


@dataclass(frozen=True)
class Knot:
    features: Features  # mean work of the bucket's recent steps
    seconds: float  # their mean wall time
    count: int  # steps observed in the bucket


@dataclass(frozen=True)
class StepTimeFit:
    knots: tuple[Knot, ...]  # sorted by token count
    row_seconds: float  # marginal cost of a sampled row (lm_head, sampler) at fixed tokens
    pair_seconds: float  # marginal cost of an attention pair at fixed tokens
    num_buckets: int
    token_spread: float  # largest / smallest mean token count among the knots

    def _curve(self, features: Features) -> tuple[list[float], list[float]]:
        """The knots' (tokens, seconds) moved to the per-token mix of `features`, with the seconds
        made non-decreasing in tokens (a step never gets faster with more work)."""
        tokens = max(features[0], 1e-9)
        rows_per_token, pairs_per_token = features[1] / tokens, features[2] / tokens
        xs, ys, floor = [], [], 0.0
        for knot in self.knots:
            tok, rows, pairs = knot.features
            moved = (
                knot.seconds
                + self.row_seconds * (rows_per_token * tok - rows)
                + self.pair_seconds * (pairs_per_token * tok - pairs)
            )
            # a correction larger than the step itself is a bad slope, not physics: keep a floor
            floor = max(floor, moved, 0.25 * knot.seconds)
            xs.append(tok)
            ys.append(floor)
        return xs, ys

    def predict(self, features: Features) -> float:
        """Step seconds at this work: linear between knots; below the smallest knot flat (a step
        costs at least that much); past the largest, at the largest knot's throughput."""
        xs, ys = self._curve(features)
        tokens = features[0]
        if tokens <= xs[0]:
            return ys[0]
        if tokens >= xs[-1]:
            return ys[-1] * tokens / xs[-1]
        i = bisect.bisect_right(xs, tokens)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0) if x1 > x0 else y1

    def saturation_tokens_per_s(self, features: Features) -> float:
        """The best throughput any measured step size delivers at this mix."""
        xs, ys = self._curve(features)
        return max(x / y for x, y in zip(xs, ys, strict=True))

    def saturation_share(self, features: Features) -> float:
        """Throughput of a step with this work / the best throughput at the same mix, in [0, 1]."""
        seconds = self.predict(features)
        if seconds <= 0 or features[0] <= 0:
            return 0.0
        return min(1.0, max(0.0, features[0] / seconds / self.saturation_tokens_per_s(features)))
