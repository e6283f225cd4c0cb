"""`histogram_quantile(φ, buckets)` over classic (`le`-labelled) histograms, as Prometheus 2.x
(promql/quantile.go) computes it: buckets grouped by every label but `le` (and the name), sorted
by upper bound, equal bounds merged, counts forced monotonic, then linear interpolation inside the
bucket the rank falls into. The lowest bucket starts at 0 (or is its own bound when that is <= 0);
a rank in the +Inf bucket answers the highest finite bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from alerts.promql.types import METRIC_NAME, Labels, Sample, Vector

BUCKET_LABEL = "le"


@dataclass
class _Bucket:
    upper_bound: float
    count: float


def _parse_bound(text: str) -> float | None:
    """The `le` value as Go's strconv.ParseFloat reads it; None when it is not a float (such a
    sample is skipped, as in Prometheus). Python's float() also takes '1_0' and padding: refused."""
    if not text or "_" in text or text != text.strip():
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _search(n: int, pred: Callable[[int], bool]) -> int:
    """Go's sort.Search, step for step (its answer on NaN counts is Prometheus' answer)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if not pred(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _coalesce(buckets: list[_Bucket]) -> list[_Bucket]:
    out = [_Bucket(buckets[0].upper_bound, buckets[0].count)]
    for b in buckets[1:]:
        if b.upper_bound == out[-1].upper_bound:
            out[-1].count += b.count
        else:
            out.append(_Bucket(b.upper_bound, b.count))
    return out


def _ensure_monotonic(buckets: list[_Bucket]) -> None:
    # rates of buckets scraped at slightly different moments can dip; Prometheus flattens them
    highest = -math.inf
    for b in buckets:
        if b.count > highest:
            highest = b.count
        elif b.count < highest:
            b.count = highest


def bucket_quantile(q: float, buckets: list[_Bucket]) -> float:
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(buckets, key=lambda b: b.upper_bound)
    if buckets[-1].upper_bound != math.inf:  # a histogram without its +Inf bucket
        return math.nan
    buckets = _coalesce(buckets)
    _ensure_monotonic(buckets)
    if len(buckets) < 2:
        return math.nan
    observations = buckets[-1].count
    if observations == 0:
        return math.nan
    rank = q * observations
    b = _search(len(buckets) - 1, lambda i: buckets[i].count >= rank)
    if b == len(buckets) - 1:
        return buckets[-2].upper_bound
    if b == 0 and buckets[0].upper_bound <= 0:
        return buckets[0].upper_bound
    start, end, count = 0.0, buckets[b].upper_bound, buckets[b].count
    if b > 0:
        start = buckets[b - 1].upper_bound
        count -= buckets[b - 1].count
        rank -= buckets[b - 1].count
    return start + (end - start) * (rank / count)


def histogram_quantile(q: float, vector: Vector) -> Vector:
    """One sample per bucket group, labelled like its buckets without `le` and the name."""
    groups: dict[Labels, list[_Bucket]] = {}
    for s in vector:
        bound = _parse_bound(next((v for k, v in s.labels if k == BUCKET_LABEL), ""))
        if bound is None:
            continue
        key = tuple(p for p in s.labels if p[0] not in (METRIC_NAME, BUCKET_LABEL))
        groups.setdefault(key, []).append(_Bucket(bound, s.value))
    return [Sample(key, bucket_quantile(q, buckets)) for key, buckets in groups.items()]
