"""An online model of an engine step's wall time against the work in it.

    T(step) = a + b_tok * tokens + b_row * sampled rows + b_att * attention pairs

`a` is what a step costs however little it carries (Python, kernel launches, reading every weight
once); the slopes are the marginal costs of the work: rows through the layers (prefill chunks and
decodes alike), rows through the lm_head and sampler (one per sequence that samples), and the
query-key pairs attention scores (a decode at context L adds L; a prefill chunk more). So the
prefill/decode mix and the context length move T, and the model says by how much.

The throughput a step delivers is its work / T; with the mix held, its limit for ever larger
batches (the saturation throughput) is work / (T - a). Their ratio is the share of saturation
throughput the step delivers:  1 - a / T.  It rises with the batch and is ~1 once `a` is small
next to the work, which is what the batch controller needs (docs/batching.md).

Observations are kept per half-octave bucket of the token count as running means (recent steps
weigh more), so the spread the warm-up sweep gives (1 to max_batch rows) survives hours of steps
at one steady size, and a few thousand steps cost a few dozen numbers. The fit is weighted least
squares over the buckets with non-negative slopes (runtime.engine.batching.fit).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from runtime.engine.batching.fit import fit_nonnegative
from runtime.engine.stats import StepStats


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


@dataclass(frozen=True)
class StepTimeFit:
    fixed_seconds: float  # a: the cost of a step at zero work
    slopes: tuple[float, float, float]  # seconds per token, per sampled row, per attention pair
    num_buckets: int  # buckets of the token count the fit used
    token_spread: float  # largest / smallest mean token count among them

    def predict(self, features: tuple[float, float, float]) -> float:
        return self.fixed_seconds + sum(b * x for b, x in zip(self.slopes, features, strict=True))

    def saturation_share(self, features: tuple[float, float, float]) -> float:
        """Throughput of a step with this work / saturation throughput at the same mix, 1 - a/T."""
        seconds = self.predict(features)
        if seconds <= 0:
            return 0.0
        return min(1.0, max(0.0, 1.0 - self.fixed_seconds / seconds))


class _Bucket:
    __slots__ = ("count", "features", "seconds")

    def __init__(self) -> None:
        self.count = 0
        self.features = [0.0, 0.0, 0.0]
        self.seconds = 0.0


class StepTimeModel:
    """Thread-safe: the engine thread observes, the controller and a metrics scrape fit."""

    def __init__(
        self,
        *,
        min_buckets: int = 2,
        min_token_spread: float = 2.0,
        memory: int = 32,
        outlier_factor: float = 3.0,
        skip_first: int = 1,
    ) -> None:
        self.min_buckets = min_buckets  # fewer distinct sizes seen: no fit (the controller holds)
        self.min_token_spread = min_token_spread  # nor when the sizes seen are too close
        self.memory = memory  # a bucket's mean follows its last ~memory steps; also its weight cap
        self.outlier_factor = outlier_factor  # a step slower than this x its bucket mean: clipped
        # a process's first forward pays one-off costs (lazy init, heap growth, kernel choice)
        self.skip_first = skip_first
        self._buckets: dict[int, _Bucket] = {}
        self._lock = threading.Lock()
        self._fit: StepTimeFit | None = None
        self._dirty = False
        self.num_observed = 0

    @staticmethod
    def bucket_of(num_tokens: int) -> int:
        return round(2 * math.log2(num_tokens))

    def observe(self, cost: StepCost, seconds: float) -> None:
        if cost.num_tokens <= 0 or not seconds > 0:
            return
        with self._lock:
            if self.skip_first > 0:
                self.skip_first -= 1
                return
            bucket = self._buckets.setdefault(self.bucket_of(cost.num_tokens), _Bucket())
            if bucket.count >= 4:  # one step preempted by another process must not move the fit
                seconds = min(seconds, self.outlier_factor * bucket.seconds)
            bucket.count += 1
            alpha = 1.0 / min(bucket.count, self.memory)
            for i, x in enumerate(cost.features):
                bucket.features[i] += alpha * (x - bucket.features[i])
            bucket.seconds += alpha * (seconds - bucket.seconds)
            self.num_observed += 1
            self._dirty = True

    def fit(self) -> StepTimeFit | None:
        """The current fit, or None while the observations cannot pin the intercept down."""
        with self._lock:
            if self._dirty:
                self._fit, self._dirty = self._refit(), False
            return self._fit

    def _refit(self) -> StepTimeFit | None:
        buckets = [b for b in self._buckets.values() if b.count > 0]
        if len(buckets) < self.min_buckets:
            return None
        tokens = [b.features[0] for b in buckets]
        spread = max(tokens) / min(tokens)
        if spread < self.min_token_spread:
            return None
        result = fit_nonnegative(
            [tuple(b.features) for b in buckets],
            [b.seconds for b in buckets],
            # step-time noise is relative (a 1 s prefill jitters by more seconds than a 10 ms
            # decode), so each bucket weighs count / T^2: small steps, which show `a`, count fully
            [min(b.count, self.memory) / (b.seconds * b.seconds) for b in buckets],
        )
        if result is None:
            return None
        intercept, slopes = result
        return StepTimeFit(
            fixed_seconds=max(0.0, intercept),
            slopes=(slopes[0], slopes[1], slopes[2]),
            num_buckets=len(buckets),
            token_spread=spread,
        )
