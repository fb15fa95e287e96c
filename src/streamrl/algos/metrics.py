"""Learning-efficiency metrics of reward curves and paired comparisons across seeds (docs/algorithms.md §1.7).

Curves are ``(x, y)``: ``x`` training progress (for cross-method comparisons, online trajectories
consumed), ``y`` mean training reward. Rewards are mapped to ``[0, 1]`` by the task's reward range;
progress to ``[0, 1]`` by the curve's own first and last ``x``. Report ``100 * AUC`` as points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from streamrl.algos.student_t import t_quantile

ArrayLike = Sequence[float] | np.ndarray


def _finite_array(name: str, values: ArrayLike) -> np.ndarray:
    out = np.asarray(values, dtype=np.float64)
    if out.ndim != 1 or out.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {out.shape}")
    if not np.isfinite(out).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return out


def _curve(x: ArrayLike, y: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = _finite_array("x", x), _finite_array("y", y)
    if xs.shape != ys.shape:
        raise ValueError(f"x has {xs.size} points but y has {ys.size}")
    if xs.size > 1 and not (np.diff(xs) > 0).all():
        raise ValueError("x must be strictly increasing (no duplicates)")
    return xs, ys


def normalize_rewards(y: ArrayLike, y_range: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """``(y - y_lo) / (y_hi - y_lo)``; no clipping or smoothing."""
    low, high = float(y_range[0]), float(y_range[1])
    if not (math.isfinite(low) and math.isfinite(high) and high > low):
        raise ValueError(f"y_range must be finite with high > low, got {y_range!r}")
    return (_finite_array("y", y) - low) / (high - low)


def learning_auc(x: ArrayLike, y: ArrayLike, y_range: tuple[float, float] = (0.0, 1.0)) -> float:
    """Trapezoid area under the normalised curve on normalised progress ``u in [0, 1]``.

    ``AUC = sum_k (u_k - u_{k-1}) (y~_k + y~_{k-1}) / 2``; a single point gives ``y~_0``.
    Raises ``ValueError`` for non-increasing or duplicate ``x``, NaN, or mismatched lengths.
    """
    xs, _ = _curve(x, y)
    ys = normalize_rewards(y, y_range)
    if xs.size == 1:
        return float(ys[0])
    u = (xs - xs[0]) / (xs[-1] - xs[0])
    return float(np.sum(np.diff(u) * (ys[1:] + ys[:-1]) / 2.0))


def step_mean_auc(x: ArrayLike, y: ArrayLike, y_range: tuple[float, float] = (0.0, 1.0)) -> float:
    """Mean of the normalised rewards, ``(1 / (K + 1)) sum_k y~_k``; only meaningful on a uniform
    step grid, so ``x`` must be evenly spaced (relative tolerance 1e-9)."""
    xs, _ = _curve(x, y)
    if xs.size > 2:
        gaps = np.diff(xs)
        if not np.allclose(gaps, gaps[0], rtol=1e-9, atol=0.0):
            raise ValueError("step_mean_auc needs an evenly spaced x grid; use learning_auc otherwise")
    return float(np.mean(normalize_rewards(y, y_range)))


def final_reward(y: ArrayLike, y_range: tuple[float, float] = (0.0, 1.0), last: int = 5) -> float:
    """Mean normalised reward over the last ``last`` logged points (all of them if fewer)."""
    if last < 1:
        raise ValueError(f"last must be >= 1, got {last}")
    return float(np.mean(normalize_rewards(y, y_range)[-last:]))


def union_grid(*xs: ArrayLike) -> np.ndarray:
    """Sorted union of the curves' ``x`` points inside the range every curve covers.

    Outside the common range one curve would need extrapolation, so those points are dropped.
    """
    if not xs:
        raise ValueError("union_grid needs at least one x grid")
    grids = [_curve(x, x)[0] for x in xs]
    low = max(g[0] for g in grids)
    high = min(g[-1] for g in grids)
    if low > high:
        raise ValueError(f"the curves' x ranges do not overlap (common range would be [{low}, {high}])")
    merged = np.unique(np.concatenate(grids))
    return merged[(merged >= low) & (merged <= high)]


def interpolate(x: ArrayLike, y: ArrayLike, grid: ArrayLike) -> np.ndarray:
    """Linear interpolation of the curve at ``grid`` points, which must lie inside ``[x_0, x_K]``."""
    xs, ys = _curve(x, y)
    points = _finite_array("grid", grid)
    if points.min() < xs[0] or points.max() > xs[-1]:
        raise ValueError(f"grid leaves the curve's x range [{xs[0]}, {xs[-1]}]; extrapolation is not supported")
    return np.interp(points, xs, ys)


def align_curves(
    x_a: ArrayLike, y_a: ArrayLike, x_b: ArrayLike, y_b: ArrayLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both curves linearly interpolated onto their union grid: ``(grid, y_a, y_b)``."""
    grid = union_grid(x_a, x_b)
    return grid, interpolate(x_a, y_a, grid), interpolate(x_b, y_b, grid)


class PairedDifference(NamedTuple):
    """Summary of per-seed differences ``a_s - b_s``."""

    mean: float
    sd: float  # sample standard deviation (n - 1)
    n: int
    ci_low: float  # two-sided t interval for the mean
    ci_high: float


def paired_difference(a: ArrayLike, b: ArrayLike, confidence: float = 0.95) -> PairedDifference:
    """Paired comparison of per-seed scores (same seeds, checkpoints and prompts).

    ``mean +- t_{(1+confidence)/2, n-1} * sd / sqrt(n)``. Multiply by 100 for percentage points.
    Needs at least two pairs (the sample s.d. is undefined for one).
    """
    first, second = _finite_array("a", a), _finite_array("b", b)
    if first.shape != second.shape:
        raise ValueError(f"a has {first.size} values but b has {second.size}; pairs must match")
    if first.size < 2:
        raise ValueError("paired_difference needs at least 2 pairs for a sample standard deviation")
    if not (0.0 < confidence < 1.0):
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    diff = first - second
    n = int(diff.size)
    mean = float(diff.mean())
    sd = float(diff.std(ddof=1))
    half_width = t_quantile(0.5 * (1.0 + confidence), n - 1) * sd / math.sqrt(n)
    return PairedDifference(mean, sd, n, mean - half_width, mean + half_width)
