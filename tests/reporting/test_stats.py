"""Paired bootstrap statistics on planted cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import make_record

from repro.reporting.stats import MAL, MIN_UNITS, SPEEDUP, compare, paired_ratio, ratio_of_ratios


def test_a_constant_ratio_gives_a_degenerate_interval_at_that_value():
    # prompts of very different speed and length, the route 1.5x AR on every one of them
    new_b, dec_b = [10, 200, 35, 80, 3], [1.0, 40.0, 2.0, 9.0, 0.7]
    got = paired_ratio(([1.5 * x for x in new_b], dec_b, new_b, dec_b))
    assert (got.value, got.low, got.high, got.n) == (1.5, 1.5, 1.5, 5)


def test_a_known_paired_difference():
    # per prompt ratios 1, 2, 3, 1, 3 with equal weights: the pooled ratio is 2 and the interval holds it
    xa, ya, xb, yb = [1, 2, 3, 1, 3], [1] * 5, [1] * 5, [1] * 5
    got = paired_ratio((xa, ya, xb, yb))
    assert got.value == 2.0 and got.n == 5
    assert 1.0 <= got.low < 2.0 < got.high <= 3.0
    # pairing matters: the same per-prompt ratios on prompts of different difficulty stay [1, 3]-bounded
    scale = [1, 100, 10, 3, 30]
    paired = paired_ratio(([x * s for x, s in zip(xa, scale)], ya, scale, yb))
    assert paired.low >= 1.0 and paired.high <= 3.0
    assert paired_ratio((xa, ya, xb, yb), seed=0) == got  # seeded: a rebuilt report prints the same


def test_too_few_prompts_give_no_interval():
    one = paired_ratio(([2], [1], [1], [1]))
    assert one.value == 2.0 and math.isnan(one.low) and math.isnan(one.high) and one.n == 1
    # below MIN_UNITS prompts (2-4 give 3-35 distinct resamples) no interval; at MIN_UNITS one
    for n in range(2, MIN_UNITS + 1):
        got = paired_ratio(([1, 2, 3, 1, 3][:n], [1] * n, [1] * n, [1] * n))
        assert got.n == n and math.isnan(got.low) == (n < MIN_UNITS)
    assert math.isnan(paired_ratio(([], [], [], [])).value)


def test_compare_pools_turns_per_prompt_and_pairs_by_prompt():
    recs = [
        make_record("ar", "mt_bench", "a", 0, accepted=[1] * 9, decode_s=1.0),
        make_record("ar", "mt_bench", "a", 1, accepted=[1] * 9, decode_s=1.0),
        make_record("ar", "mt_bench", "b", 0, accepted=[1] * 9, decode_s=2.0),
        make_record("x", "mt_bench", "a", 0, accepted=[3] * 3, decode_s=0.5),
        make_record("x", "mt_bench", "a", 1, accepted=[3] * 3, decode_s=0.5),
        make_record("x", "mt_bench", "b", 0, accepted=[3] * 3, decode_s=1.0),
        make_record("x", "mt_bench", "c", 0, accepted=[3] * 3, decode_s=1.0),  # no AR record: not paired
    ]
    sp = compare(recs, "x", "ar", ["mt_bench"], SPEEDUP)
    assert sp.n == 2 and sp.value == (30 / 2.0) / (30 / 4.0) and math.isnan(sp.low)  # n < MIN_UNITS
    mal = compare(recs, "x", "ar", ["mt_bench"], MAL)
    assert mal.value == 3.0


def test_compare_pairs_each_prompt_over_the_turns_both_routes_have():
    """A turn the reference lacks (an interrupted run) is left out of the route's sums for that prompt too:
    the two rates cover the same turns. Here the route's second turn of prompt a is 4x slower; counted
    against AR's one turn it would have pulled the speedup down."""
    recs = [
        make_record("ar", "mt_bench", "a", 0, accepted=[1] * 9, decode_s=1.0),
        make_record("ar", "mt_bench", "b", 0, accepted=[1] * 9, decode_s=1.0),
        make_record("ar", "mt_bench", "b", 1, accepted=[1] * 9, decode_s=1.0),
        make_record("x", "mt_bench", "a", 0, accepted=[3] * 3, decode_s=0.5),
        make_record("x", "mt_bench", "a", 1, accepted=[3] * 3, decode_s=2.0),  # AR has no turn 1 of a
        make_record("x", "mt_bench", "b", 0, accepted=[3] * 3, decode_s=0.5),
        make_record("x", "mt_bench", "b", 1, accepted=[3] * 3, decode_s=0.5),
    ]
    sp = compare(recs, "x", "ar", ["mt_bench"], SPEEDUP)
    assert sp.n == 2 and sp.value == 2.0  # every common turn 2x


def _percentile_bootstrap(arrays: list[list[float]], draws: int, seed: int) -> tuple[float, float]:
    """An independent paired percentile bootstrap of the ratio of ratios: prompts drawn with replacement
    (all four sums of a prompt together), the 2.5% and 97.5% quantiles of the statistic."""
    data = np.asarray(arrays, dtype=float)  # [4, n]
    idx = np.random.default_rng(seed).integers(0, data.shape[1], size=(draws, data.shape[1]))
    xa, ya, xb, yb = (data[i][idx].sum(axis=1) for i in range(4))
    low, high = np.quantile((xa / ya) / (xb / yb), [0.025, 0.975])
    return float(low), float(high)


def test_the_interval_is_the_paired_percentile_bootstrap_at_95_percent():
    """Against a plain numpy bootstrap (another generator, 40000 draws) on skewed, unequally weighted
    prompts: the same 95% percentile interval within Monte Carlo error (1.5%). A 50% interval, a basic
    (reflected) one or an unpaired resampling are each further off than that (checked on this data)."""
    rng = np.random.default_rng(3)
    n = 24
    tokens = rng.integers(20, 400, n).astype(float)
    ref_s = tokens / rng.uniform(80, 120, n)
    ratio = np.exp(rng.standard_normal(n) * 0.5 + 0.3)  # log-normal per-prompt speedups: skewed
    arrays = [tokens.tolist(), (ref_s / ratio).tolist(), tokens.tolist(), ref_s.tolist()]
    got = paired_ratio(arrays)
    low, high = _percentile_bootstrap(arrays, 40000, 11)
    assert (
        got.n == n and got.low == pytest.approx(low, rel=0.015) and got.high == pytest.approx(high, rel=0.015)
    )
    # the alternatives the check must tell apart from the percentile interval
    half = np.quantile(
        [float(ratio_of_ratios(*(np.asarray(a)[i] for a in arrays))) for i in
         np.random.default_rng(5).integers(0, n, size=(4000, n))], [0.25, 0.75])  # fmt: skip
    basic = (2 * got.value - high, 2 * got.value - low)
    unpaired_idx = [np.random.default_rng(7 + k).integers(0, n, size=(20000, n)) for k in range(2)]
    a_rate = np.asarray(arrays[0])[unpaired_idx[0]].sum(1) / np.asarray(arrays[1])[unpaired_idx[0]].sum(1)
    b_rate = np.asarray(arrays[2])[unpaired_idx[1]].sum(1) / np.asarray(arrays[3])[unpaired_idx[1]].sum(1)
    unpaired = np.quantile(a_rate / b_rate, [0.025, 0.975])
    for other in (half, basic, unpaired):
        assert abs(other[0] - low) > 0.03 * low or abs(other[1] - high) > 0.03 * high, other
