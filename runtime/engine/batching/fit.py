"""Weighted least squares with a ridge on the slopes and non-negative slopes, in plain Python.

The step-time model fits at most a handful of coefficients over a few dozen points once per control
interval, so a normal-equations solve is exact enough and cheaper than a call into numpy or torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when the system is singular."""
    n = len(rhs)
    rows = [[*row, value] for row, value in zip(matrix, rhs, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) < 1e-12:
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(col + 1, n):
            factor = rows[r][col] / rows[col][col]
            for k in range(col, n + 1):
                rows[r][k] -= factor * rows[col][k]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        acc = rows[r][n] - sum(rows[r][k] * out[k] for k in range(r + 1, n))
        out[r] = acc / rows[r][r]
    return out


def _fit_once(
    xs: Sequence[Sequence[float]],
    ys: Sequence[float],
    ws: Sequence[float],
    active: list[int],
    ridge: float,
) -> list[float] | None:
    """Coefficients [intercept, *slopes of `active` columns] minimising
    sum w (y - b0 - b.x)^2 + ridge * sum(w) * |b|^2 (columns pre-scaled to unit RMS)."""
    dim = 1 + len(active)
    ata = [[0.0] * dim for _ in range(dim)]
    aty = [0.0] * dim
    for x, y, w in zip(xs, ys, ws, strict=True):
        row = [1.0] + [x[j] for j in active]
        for i in range(dim):
            aty[i] += w * row[i] * y
            for k in range(dim):
                ata[i][k] += w * row[i] * row[k]
    total = sum(ws)
    for i in range(1, dim):  # the intercept is not shrunk: it is the quantity we are after
        ata[i][i] += ridge * total
    return _solve(ata, aty)


def fit_nonnegative(
    xs: Sequence[Sequence[float]],
    ys: Sequence[float],
    ws: Sequence[float],
    *,
    ridge: float = 1e-6,
) -> tuple[float, list[float]] | None:
    """(intercept, slopes) of y ~ b0 + sum b_j x_j with every b_j >= 0: a column whose slope comes
    out negative is dropped (its slope set to 0) and the rest refit. A step cannot get cheaper with
    more work, so a negative slope is noise or collinearity, never physics. None if unsolvable."""
    if not xs:
        return None
    num_features = len(xs[0])
    # columns scaled to unit weighted RMS, so one ridge weight suits every feature (scaling by
    # the largest value would let one huge prefill step squash the rest and the ridge bias them)
    total = sum(ws) or 1.0
    scale = [
        math.sqrt(sum(w * x[j] * x[j] for x, w in zip(xs, ws, strict=True)) / total) or 1.0
        for j in range(num_features)
    ]
    scaled = [[x[j] / scale[j] for j in range(num_features)] for x in xs]
    active = [j for j in range(num_features) if any(row[j] for row in scaled)]
    while True:
        coef = _fit_once(scaled, ys, ws, active, ridge)
        if coef is None:
            return None
        negative = [(coef[1 + i], j) for i, j in enumerate(active) if coef[1 + i] < 0]
        if not negative:
            break
        active.remove(min(negative)[1])
    slopes = [0.0] * num_features
    for i, j in enumerate(active):
        slopes[j] = coef[1 + i] / scale[j]
    return coef[0], slopes


def fit_within(
    cov_xx: Sequence[Sequence[float]], cov_xy: Sequence[float], *, ridge: float = 1e-3
) -> list[float]:
    """Slopes b >= 0 of y ~ b.x from pooled within-group (co)variances (the group means already
    subtracted, so no intercept): solve (Sxx + ridge) b = Sxy, a column whose slope comes out
    negative dropped and the rest refit, as in `fit_nonnegative`. A column with no variance gets
    slope 0: the data say nothing about it. Columns are scaled to unit variance first, so one ridge
    weight suits every feature."""
    n = len(cov_xy)
    scale = [math.sqrt(cov_xx[j][j]) if cov_xx[j][j] > 0 else 0.0 for j in range(n)]
    active = [j for j in range(n) if scale[j] > 0]
    slopes = [0.0] * n
    while active:
        matrix = [
            [cov_xx[i][k] / (scale[i] * scale[k]) + (ridge if i == k else 0.0) for k in active]
            for i in active
        ]
        coef = _solve(matrix, [cov_xy[i] / scale[i] for i in active])
        if coef is None:
            return slopes
        negative = [(c, j) for c, j in zip(coef, active, strict=True) if c < 0]
        if not negative:
            for c, j in zip(coef, active, strict=True):
                slopes[j] = c / scale[j]
            break
        active.remove(min(negative)[1])
    return slopes
