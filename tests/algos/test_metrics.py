"""Learning-curve AUC, final reward, curve alignment and paired statistics: spec §1.7, §1.8.5."""

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.algos import (
    align_curves,
    final_reward,
    interpolate,
    learning_auc,
    paired_difference,
    step_mean_auc,
    t_cdf,
    t_quantile,
    union_grid,
)


def _increasing(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.uniform(0.01, 5.0, n)) + rng.uniform(-100, 100)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 30), c=st.floats(-2.0, 2.0))
def test_shared_1_8_5_constant_curve_gives_its_value(seed, n, c):
    assert learning_auc(_increasing(seed, n), [c] * n) == pytest.approx(c, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 30))
def test_shared_1_8_5_linear_ramp_gives_one_half(seed, n):
    x = _increasing(seed, n)
    y = (x - x[0]) / (x[-1] - x[0])  # 0 -> 1 linearly in x, sampled non-uniformly
    assert learning_auc(x, y) == pytest.approx(0.5, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 30), scale=st.floats(1e-3, 1e6), offset=st.floats(-1e3, 1e3))
def test_shared_1_8_5_invariant_to_rescaling_x(seed, n, scale, offset):
    x = _increasing(seed, n)
    y = np.random.default_rng(seed + 1).uniform(0, 1, n)
    assert learning_auc(scale * x + offset, y) == pytest.approx(learning_auc(x, y), rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), extra=st.integers(0, 20))
def test_shared_1_8_5_non_uniform_spacing_matches_analytic_integral(seed, extra):
    # piecewise-linear curve through (0, 0), (0.25, 1), (0.6, 0.3), (1, 0.3) on x in [0, 1]:
    # integral = 0.125 + 0.35 * 0.65 + 0.4 * 0.3 = 0.4725
    knots_x, knots_y = [0.0, 0.25, 0.6, 1.0], [0.0, 1.0, 0.3, 0.3]
    rng = random.Random(seed)
    x = np.unique(np.concatenate([knots_x, [rng.uniform(0, 1) for _ in range(extra)]]))
    y = np.interp(x, knots_x, knots_y)
    assert learning_auc(40 * x + 3, y) == pytest.approx(0.4725, abs=1e-12)


def test_auc_reward_range_single_point_and_points():
    assert learning_auc([0, 1, 2], [-1.0, 0.0, 1.0], y_range=(-1.0, 1.0)) == pytest.approx(0.5)
    assert learning_auc([100], [0.7]) == 0.7  # K = 0: the single normalised reward
    assert learning_auc([0, 10], [0.532, 0.532]) * 100 == pytest.approx(53.2)


@pytest.mark.parametrize(
    "x, y, message",
    [
        ([0, 1, 1], [0, 0, 0], "strictly increasing"),
        ([0, 2, 1], [0, 0, 0], "strictly increasing"),
        ([0, 1], [0.0, math.nan], "NaN"),
        ([0, math.inf], [0.0, 1.0], "NaN"),
        ([0, 1], [0.0], "points"),
        ([], [], "non-empty"),
    ],
)
def test_auc_bad_input_raises(x, y, message):
    with pytest.raises(ValueError, match=message):
        learning_auc(x, y)


def test_auc_bad_reward_range_raises():
    with pytest.raises(ValueError, match="y_range"):
        learning_auc([0, 1], [0, 1], y_range=(1.0, 1.0))


def test_step_mean_auc_and_final_reward():
    y = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert step_mean_auc([0, 10, 20, 30, 40, 50], y) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="evenly spaced"):
        step_mean_auc([0, 1, 3, 4, 5, 6], y)
    assert final_reward(y) == pytest.approx(np.mean(y[-5:]))
    assert final_reward([0.5, 1.5], y_range=(0.0, 2.0)) == pytest.approx(0.5)


def test_curves_on_different_grids_are_aligned_on_the_union_grid():
    grid, ya, yb = align_curves([0, 2, 4, 6], [0.0, 0.2, 0.4, 0.6], [1, 3, 6, 8], [1.0, 0.8, 0.5, 0.3])
    np.testing.assert_allclose(grid, [1, 2, 3, 4, 6])  # points outside the common range dropped
    np.testing.assert_allclose(ya, [0.1, 0.2, 0.3, 0.4, 0.6])
    np.testing.assert_allclose(yb, [1.0, 0.9, 0.8, 0.7, 0.5])
    with pytest.raises(ValueError, match="do not overlap"):
        union_grid([0, 1], [2, 3])
    with pytest.raises(ValueError, match="extrapolation"):
        interpolate([0, 1], [0, 1], [2])


def test_paired_difference_statistics():
    a = [0.70, 0.75, 0.72]
    b = [0.55, 0.50, 0.56]
    out = paired_difference(a, b)
    diffs = np.array(a) - np.array(b)
    assert out.n == 3
    assert out.mean == pytest.approx(diffs.mean())
    assert out.sd == pytest.approx(diffs.std(ddof=1))
    t975_df2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # closed form of the t quantile for df = 2
    half = t975_df2 * out.sd / math.sqrt(3)
    assert (out.ci_low, out.ci_high) == (pytest.approx(out.mean - half), pytest.approx(out.mean + half))
    with pytest.raises(ValueError, match="at least 2 pairs"):
        paired_difference([1.0], [0.0])
    with pytest.raises(ValueError, match="pairs must match"):
        paired_difference([1.0, 2.0], [0.0])


@settings(max_examples=50, deadline=None)
@given(p=st.floats(0.001, 0.999))
def test_t_quantile_matches_closed_forms(p):
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9, abs=1e-12)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9, abs=1e-12)
    for df in (3, 7.5, 40):
        assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-12)


@pytest.mark.parametrize("df, expected", [(4, 2.7764451051977987), (9, 2.2621571627409915), (30, 2.0422724563012373)])
def test_t_quantile_table_values(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, rel=1e-9)


def test_t_quantile_approaches_the_normal_quantile():
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959963984540054, rel=1e-6)
    with pytest.raises(ValueError, match="quantile level"):
        t_quantile(1.0, 3)
