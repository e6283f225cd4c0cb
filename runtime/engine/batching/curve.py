"""The step-time curve the model fits, and the saturation share read off it.

A device's step time against the batch is not affine: a CPU's or a GPU's GEMMs cost about the
same for 1 to n* rows (reading the weights dominates), then grow about linearly (the arithmetic
dominates): T(n) ~ max(t0, c*n), with a soft knee. An affine fit a + b*n through such points puts
`a` near t0 and `b` well below c, so its saturation throughput 1/b is far above what any batch
delivers, and 1 - a/T reads ~0.5 at the very batch that saturates the device (issue 28). So the
curve here is the measured one: one knot per bucket of the batch (sampled rows: the sequences a
step advances, what the controller limits and what tokens/s counts), linear between knots, and the
saturation throughput is the best throughput any knot delivers, measured, not extrapolated, among
knots of a few steps at least. Knots measured at another mix (the warm-up's short prompts, more or
fewer prefill tokens per sequence, a context that has grown since) are first moved to the queried
mix with the within-bucket marginal costs of a token and of an attention pair
(runtime.engine.batching.buckets).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

Features = tuple[float, float, float]  # tokens, sampled rows, attention pairs


@dataclass(frozen=True)
class Knot:
    features: Features  # mean work of the bucket's recent steps
    seconds: float  # their mean wall time
    count: int  # steps observed in the bucket
    # the marginal costs of a token and of an attention pair at this batch: the bucket's own
    # within slopes once it has seen enough steps, the pooled ones before (a token costs ~0 in
    # the flat part of the curve and its full share past the knee: one slope cannot say both)
    token_seconds: float
    pair_seconds: float
    bucket: int = 0  # StepTimeModel.bucket_of of its batch


@dataclass(frozen=True)
class StepTimeFit:
    knots: tuple[Knot, ...]  # sorted by sampled rows (empty: only the reference sweep so far)
    token_seconds: float  # pooled marginal cost of a token (prefill chunk row) at a fixed batch
    pair_seconds: float  # pooled marginal cost of an attention pair at a fixed batch
    num_buckets: int
    row_spread: float  # largest / smallest mean batch (sampled rows) among the knots
    # the warm-up sweep's knots (StepTimeModel.seal_warmup), the shape of the curve over the
    # batch; empty when there was no sweep
    reference: tuple[Knot, ...] = ()
    min_count: int = 3  # steps a knot needs to stand for the saturation throughput
    max_extrapolation: float = 4.0  # the flat-tail extrapolation's bound, x the measured best
    flat_top: float = 0.1  # the top's time grows by at most this share of its batch's growth
    # whether the top may be extrapolated, decided on the reference sweep alone when there is
    # one (anchored): its sizes measured within seconds of each other; None: on these knots
    top_is_flat: bool | None = None

    def _curve(self, features: Features) -> tuple[list[float], list[float]]:
        """The knots' (rows, seconds) moved to the per-row mix of `features`."""
        rows = max(features[1], 1e-9)
        tokens_per_row, pairs_per_row = features[0] / rows, features[2] / rows
        xs, ys = [], []
        for knot in self.knots:
            tok, num_rows, pairs = knot.features
            moved = (
                knot.seconds
                + knot.token_seconds * (tokens_per_row * num_rows - tok)
                + knot.pair_seconds * (pairs_per_row * num_rows - pairs)
            )
            # a correction larger than the step itself is a bad slope, not physics: keep a floor
            xs.append(num_rows)
            ys.append(max(moved, 0.25 * knot.seconds))
        return xs, ys

    def predict(self, features: Features) -> float:
        """Step seconds at this work: linear in the batch between knots; below the smallest knot
        flat (a step costs at least that much); past the largest, at the largest's throughput."""
        xs, ys = self._curve(features)
        rows = features[1]
        if rows <= xs[0]:
            return ys[0]
        if rows >= xs[-1]:
            return ys[-1] * rows / xs[-1]
        i = bisect.bisect_right(xs, rows)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (rows - x0) / (x1 - x0) if x1 > x0 else y1

    def saturation_rows_per_s(self, features: Features) -> float:
        """The saturation throughput (sequences advanced per second) at this mix: the best any
        well-measured batch delivers (knots of at least `min_count` steps when there are any: one
        step measured while another process paused is no saturation throughput), or more where
        the curve is still flat at the largest batches measured. Past the last two knots the
        step time is taken as their line, whose throughput tends to 1/slope: ~the measured best
        on a device past its knee (T ~ c*n), far above it on one whose step time is still flat
        at the cap (then u reads low there: the cap, not the device, limits the batch). Half the
        line's limit counts, bounded at `max_extrapolation` x the measured best."""
        xs, ys = self._curve(features)
        trusted = [i for i, k in enumerate(self.knots) if k.count >= self.min_count]
        use = trusted or list(range(len(xs)))
        best = max(xs[i] / ys[i] for i in use)
        i, j = (use[-2], use[-1]) if len(use) >= 2 else (0, 0)
        # only a top truly flat (time growing by at most a tenth of the batch's growth: the
        # runbook's flat-T(n) case) is extrapolated; two knots of a few steps each on a loaded
        # CPU can look flat-ish by noise alone, and a 4x extrapolation then read u ~0.1 at a
        # pinned batch delivering half the best throughput (issue 28, the small llama)
        flat = self.top_is_flat if self.top_is_flat is not None else self._flat(xs, ys, i, j)
        if len(use) >= 2 and xs[j] > xs[i] and flat:
            slope = (ys[j] - ys[i]) / (xs[j] - xs[i])
            tail = 1.0 / slope if slope > 0 else float("inf")
            # a line across a soft knee overshoots (the affine fit's error): only a tail at
            # least twice the measured best says "still flat", and only the excess counts
            best = max(best, min(tail / 2.0, self.max_extrapolation * best))
        return best

    def _flat(self, xs: list[float], ys: list[float], i: int, j: int) -> bool:
        grows = xs[j] / xs[i] - 1.0 if i != j and xs[i] > 0 else 0.0
        return grows > 0 and ys[j] / ys[i] - 1.0 <= self.flat_top * grows

    def share_of_bucket(self, bucket: int) -> float | None:
        """The share a bucket's own recent steps deliver, at their own mix (their knot moves by
        nothing, so a bucket that is the best reads exactly 1); None if it has no step yet (its
        first step, a new shape's cold one, is skipped: often one big prefill besides)."""
        for knot in self.knots:
            if knot.bucket == bucket:
                rows = knot.features[1] / knot.seconds
                best = self.anchored(knot).saturation_rows_per_s(knot.features)
                return min(1.0, rows / best)
        return None

    def anchored(self, live: Knot) -> StepTimeFit:
        """The curve to compare the live knot with: the live knots of 3+ steps, and for the
        sizes without one the reference sweep's knots scaled by the live knot's own ratio to the
        reference curve at its work. The sweep runs its few steps before the process is warm, and
        a shared machine's load moves all step times together: as a ratio, the sweep's shape
        holds where its absolute times do not (unscaled, every size the traffic never runs
        looked slower than the live one, and u read ~1 at any pinned batch on a real CPU)."""
        if not self.reference or len(self.reference) < 2:
            return self
        reference = replace(self, knots=_local_token_costs(self.reference), reference=())
        scale = live.seconds / max(reference.predict(live.features), 1e-12)
        keep = [k for k in self.knots if k.count >= self.min_count or k.bucket == live.bucket]
        have = {k.bucket for k in keep}
        scaled = [replace(k, seconds=k.seconds * scale) for k in self.reference]
        knots = keep + [k for k in scaled if k.bucket not in have]
        knots.sort(key=lambda k: k.features[1])
        # flat at the top or not is the sweep's call: a live knot against a scaled reference one
        # can look flat (or even faster at the bigger size) by a change of load alone, and the 4x
        # extrapolation then read u 0.12 at the best pinned batch on the small llama
        xs = [k.features[1] for k in self.reference]
        ys = [k.seconds for k in self.reference]
        flat = self._flat(xs, ys, len(xs) - 2, len(xs) - 1)
        return replace(self, knots=tuple(knots), reference=(), top_is_flat=flat)

    def saturation_share(self, features: Features) -> float:
        """Throughput of a step with this work / the best throughput at the same mix, in [0, 1]."""
        if not self.knots:
            return 0.0
        seconds = self.predict(features)
        if seconds <= 0 or features[1] <= 0:
            return 0.0
        return min(1.0, max(0.0, features[1] / seconds / self.saturation_rows_per_s(features)))


def _local_token_costs(knots: tuple[Knot, ...]) -> tuple[Knot, ...]:
    """The reference knots with a token's cost at most the sweep's own next step up in work.
    A live mix with more tokens per sequence (prompts joining) moves a knot along the curve; the
    within-bucket slopes measured at the live size say what a token costs *there*, which past
    the knee is its full share, while a sweep size still on the flat part pays ~nothing for
    those tokens (one slope for all sizes read a size just past the live knee ~0.15 low)."""
    out = list(knots)
    for i in range(len(knots) - 1):
        a, b = knots[i], knots[i + 1]
        extra = b.features[0] - a.features[0]
        if extra > 0:
            local = max(0.0, (b.seconds - a.seconds) / extra)
            out[i] = replace(a, token_seconds=min(a.token_seconds, local))
    return tuple(out)
