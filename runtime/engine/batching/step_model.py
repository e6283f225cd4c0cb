"""An online model of an engine step's wall time against the work in it, and its saturation share.

Each step's work is its sampled rows (the sequences it advances: the batch), its tokens (rows
through the layers: prefill chunks and decodes alike) and its attention pairs (a decode at context
L adds L). Steps are kept per half-octave bucket of the batch (runtime.engine.batching.buckets): a
running mean of work and time per bucket is one measured knot of the curve T(batch), and the
buckets' within-bucket covariances give the marginal costs of a token and of an attention pair,
so the prefill/decode mix and the context length move T by what they cost.

The share of saturation throughput a step delivers is its throughput over the best throughput any
measured batch delivers at the same mix (runtime.engine.batching.curve): ~1 at the batch that
saturates the device, whatever the curve's shape. (An affine fit a + b*tokens, and its share
1 - a/T, read ~0.5 there on a device whose step time is flat and then linear: issue 28.) Prefill
tokens and decode tokens are not the same work (a decode row also pays the lm_head, the sampler
and its own attention), so the throughput counted is sequences advanced, as tokens/s is measured.

A few dozen numbers stand for any number of steps; the curve is rebuilt only when a step came
since, at most once per read. Buckets outside the current batch size keep what earlier traffic
measured, and the warm-up sweep stays frozen as the reference curve (`seal_warmup`), so hours at
one steady size do not move them; sizes never run live are the reference scaled by the live
size's own live/reference ratio (curve.py: the sweep's shape, not its cold absolute times).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from runtime.engine.batching.buckets import FEATURES, Bucket
from runtime.engine.batching.curve import Knot, StepTimeFit
from runtime.engine.batching.fit import fit_within
from runtime.engine.stats import StepStats

__all__ = ["Knot", "StepCost", "StepTimeFit", "StepTimeModel"]


@dataclass(frozen=True)
class StepCost:
    """The work in one step, as the step-time model sees it."""

    num_tokens: int  # rows through the layers: prefill chunk tokens + decode tokens
    num_sampled: int  # rows through the lm_head and the sampler
    num_attention_pairs: int  # query-key pairs scored by attention over the step

    @classmethod
    def of(cls, step: StepStats) -> StepCost:
        return cls(
            num_tokens=step.num_prefill_tokens + step.num_decode_tokens,
            num_sampled=step.num_sampled,
            num_attention_pairs=step.num_attention_pairs,
        )

    @property
    def features(self) -> tuple[float, float, float]:
        return float(self.num_tokens), float(self.num_sampled), float(self.num_attention_pairs)


class StepTimeModel:
    """Thread-safe: the engine thread observes, the controller and a metrics scrape fit."""

    def __init__(
        self,
        *,
        min_buckets: int = 2,
        min_row_spread: float = 2.0,
        memory: int = 32,
        moment_memory: int = 512,
        outlier_factor: float = 3.0,
        skip_first: int = 1,
        own_slopes_after: int = 64,
        skip_first_per_size: bool = True,
    ) -> None:
        self.min_buckets = min_buckets  # fewer distinct sizes seen: no fit (the controller holds)
        self.min_row_spread = min_row_spread  # nor when the sizes seen are too close
        self.memory = memory  # a knot follows its bucket's last ~memory steps
        self.moment_memory = moment_memory  # the mix slopes follow the last ~this many per bucket
        self.outlier_factor = outlier_factor  # a step slower than this x its bucket mean: clipped
        # a process's first forward pays one-off costs (lazy init, heap growth, kernel choice)
        self.skip_first = skip_first
        self.own_slopes_after = own_slopes_after  # steps before a bucket's own mix slopes are used
        # and each batch size's first step (allocations, kernel choice: on CPU several times a
        # warm step; the warm-up would otherwise seed the big sizes with cold steps)
        self.skip_first_per_size = skip_first_per_size
        self._buckets: dict[int, Bucket] = {}
        # the warm-up sweep's knots, frozen (seal_warmup): the curve's shape over the batch,
        # every size measured within a second or two of the others
        self._reference: dict[int, Bucket] = {}
        self._lock = threading.Lock()
        self._fit: StepTimeFit | None = None
        self._dirty = False
        self.num_observed = 0

    @staticmethod
    def bucket_of(num_sampled: int) -> int:
        return round(2 * math.log2(num_sampled))

    def observe(self, cost: StepCost, seconds: float) -> None:
        # a step that samples nothing (a chunk of a long prompt) advances no sequence: its time
        # still counts in the measured throughput (throughput.py), not as a knot
        if cost.num_sampled <= 0 or not seconds > 0:
            return
        with self._lock:
            if self.skip_first > 0:
                self.skip_first -= 1
                return
            key = self.bucket_of(cost.num_sampled)
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = Bucket(skip_first=self.skip_first_per_size)
            if bucket.count >= 4:  # one step preempted by another process must not move the fit
                # against the bucket's mean scaled by this step's tokens: a step that prefills a
                # prompt is slow for its work, not an outlier (clipping it hid the token cost, and
                # knots moved to a prefill-heavier mix came out too fast: issue 28)
                more = max(1.0, cost.features[0] / max(bucket.features[0], 1e-9))
                seconds = min(seconds, self.outlier_factor * bucket.seconds * more)
            bucket.add(cost.features, seconds, self.memory, self.moment_memory)
            self.num_observed += 1
            self._dirty = True

    def seal_warmup(self) -> None:
        """Freeze what the warm-up sweep measured as the reference curve, and start the live
        buckets afresh. The sweep's steps are few and run before the process is warm (on the
        `small` llama on CPU slower than live steps of the same size): compared as absolute
        times with live knots, every size the traffic never runs looks slower than the one it
        does, and u reads ~1 at any pinned batch. So the live knot of the window's size is
        compared with the reference curve *scaled* by its own live/reference ratio (curve.py)."""
        with self._lock:
            self._reference = {k: b for k, b in self._buckets.items() if b.count > 0}
            self._buckets = {}
            self._dirty = True

    def fit(self) -> StepTimeFit | None:
        """The current curve, or None while too few step sizes were seen to tell its shape."""
        with self._lock:
            if self._dirty:
                self._fit, self._dirty = self._refit(), False
            return self._fit

    def _refit(self) -> StepTimeFit | None:
        ids = {id(b): key for key, b in self._buckets.items()}
        buckets = sorted((b for b in self._buckets.values() if b.count > 0), key=_rows)
        # the sizes known: live ones, and the reference sweep's (its shape over the batch)
        known = {k for k, b in self._buckets.items() if b.count > 0} | set(self._reference)
        rows = [_rows(b) for b in buckets] + [_rows(b) for b in self._reference.values()]
        if len(known) < self.min_buckets:
            return None
        spread = max(rows) / min(rows)
        if spread < self.min_row_spread:
            return None
        # pooled within-bucket covariances: the mix slopes with each bucket's level taken out
        cov_xx = [[0.0] * FEATURES for _ in range(FEATURES)]
        cov_xy = [0.0] * FEATURES
        for b in buckets:
            w = b.weight(self.moment_memory)
            for i in range(FEATURES):
                cov_xy[i] += w * b.cov_xy[i]
                for k in range(FEATURES):
                    cov_xx[i][k] += w * b.cov_xx[i][k]
        slopes = fit_within(cov_xx, cov_xy)
        knots = []
        for b in buckets:
            own = fit_within(b.cov_xx, b.cov_xy) if b.count >= self.own_slopes_after else slopes
            knots.append(Knot(_features(b), b.seconds, b.count, own[0], own[2], ids[id(b)]))
        reference = tuple(
            Knot(_features(b), b.seconds, b.count, slopes[0], slopes[2], key)
            for key, b in sorted(self._reference.items(), key=lambda kv: _rows(kv[1]))
        )
        return StepTimeFit(
            knots=tuple(knots),
            reference=reference,
            token_seconds=slopes[0],
            pair_seconds=slopes[2],
            num_buckets=len(buckets),
            row_spread=spread,
        )


def _rows(bucket: Bucket) -> float:
    return bucket.features[1]


def _features(bucket: Bucket) -> tuple[float, float, float]:
    return bucket.features[0], bucket.features[1], bucket.features[2]
