"""Paired statistics over prompts: ratios of token-weighted means with percentile-bootstrap 95% CIs.

A paper table compares two routes decoded on the same prompts. The unit of resampling is the prompt
(suite, prompt_id; MT-Bench's two turns pooled): for route a and reference b, each prompt gives the
sums (x_a, y_a, x_b, y_b), and the statistic is (sum x_a / sum y_a) / (sum x_b / sum y_b) over the
prompts drawn. Speedup: x = new tokens, y = decode seconds; MAL ratio: x = accepted tokens, y =
verify steps. The point estimate is the statistic on the prompts themselves, so it equals the
token-weighted numbers of ``repro.reporting.report.summarize`` for a suite.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import bootstrap

from repro.reporting.records import DecodeRecord

CONFIDENCE = 0.95
RESAMPLES = 9999
SEED = 0  # the bootstrap's generator: a rebuilt report prints the same interval
MIN_UNITS = 5  # fewest prompts for an interval: below it a percentile bootstrap has a handful of distinct
# resamples (3 at n = 2) and its "95%" interval covers far less than 95%, so none is printed

Unit = tuple[str, str]  # (suite, prompt_id)
SPEEDUP = ("new_tokens", "decode_s")
MAL = ("accepted", "steps")


@dataclass(frozen=True)
class Paired:
    """A paired ratio with its percentile-bootstrap CI (NaN below :data:`MIN_UNITS` prompts) and n prompts."""

    value: float
    low: float
    high: float
    n: int


def unit_sums(
    records: Iterable[DecodeRecord],
    route: str,
    suites: Sequence[str],
    turns: set[tuple[str, str, int]] | None = None,
) -> dict[Unit, dict[str, float]]:
    """Per prompt of ``suites``, the route's new tokens, decode seconds, accepted tokens and verify steps
    (over the (suite, prompt, turn) in ``turns`` when given)."""
    out: dict[Unit, dict[str, float]] = {}
    for r in records:
        if r.route != route or r.suite not in suites:
            continue
        if turns is not None and (r.suite, r.prompt_id, r.turn) not in turns:
            continue
        sums = out.setdefault(
            (r.suite, r.prompt_id), dict.fromkeys(("new_tokens", "decode_s", "accepted", "steps"), 0.0)
        )
        sums["new_tokens"] += r.new_tokens
        sums["decode_s"] += r.decode_s
        sums["accepted"] += sum(r.accepted_lengths)
        sums["steps"] += r.steps
    return out


def ratio_of_ratios(
    xa: np.ndarray, ya: np.ndarray, xb: np.ndarray, yb: np.ndarray, axis: int = -1
) -> np.ndarray:
    """(sum xa / sum ya) / (sum xb / sum yb) along ``axis`` (vectorised for scipy's bootstrap)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (xa.sum(axis) / ya.sum(axis)) / (xb.sum(axis) / yb.sum(axis))


def paired_ratio(arrays: Sequence[Sequence[float]], seed: int = SEED) -> Paired:
    """The ratio of :func:`ratio_of_ratios` over paired units with its percentile-bootstrap CI.

    ``arrays`` = (xa, ya, xb, yb), one entry per unit. Resampling draws units (all four values of a
    unit together: ``paired=True``). A statistic that is the same on every resample (e.g. a constant
    per-unit ratio) gives the degenerate interval [value, value].
    """
    data = [np.asarray(a, dtype=float) for a in arrays]
    n = len(data[0])
    if n == 0:
        return Paired(math.nan, math.nan, math.nan, 0)
    value = float(ratio_of_ratios(*data))
    if n < MIN_UNITS or not math.isfinite(value):
        return Paired(value, math.nan, math.nan, n)
    res = bootstrap(
        data, ratio_of_ratios, paired=True, vectorized=True, n_resamples=RESAMPLES,
        confidence_level=CONFIDENCE, method="percentile", rng=np.random.default_rng(seed),
    )  # fmt: skip
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    # the percentile interval of a constant statistic is that constant (up to rounding in the sums)
    if math.isclose(low, value, rel_tol=1e-12) and math.isclose(high, value, rel_tol=1e-12):
        low = high = value
    return Paired(value, low, high, n)


def paired_sums(
    records: Sequence[DecodeRecord],
    route: str,
    reference: str | None,
    suites: Sequence[str],
    what: tuple[str, str],
) -> tuple[list[float], list[float], list[float], list[float]]:
    """The arrays of :func:`paired_ratio` for ``route`` over ``reference`` on the prompts of ``suites`` both
    have, each prompt over the turns both have (a turn one of them lacks, e.g. in an interrupted run,
    would pair unlike work, and a refused external loop's turn, 0 tokens in 0 s, pairs with nothing):
    ``what`` = SPEEDUP or MAL."""
    held = [
        {(r.suite, r.prompt_id, r.turn) for r in records if r.route == name and r.decode_s > 0}
        for name in (route, reference)
    ]
    both = held[0] & held[1]
    a, b = unit_sums(records, route, suites, both), unit_sums(records, reference or "", suites, both)
    units = sorted(set(a) & set(b))
    x, y = what
    return (
        [a[u][x] for u in units],
        [a[u][y] for u in units],
        [b[u][x] for u in units],
        [b[u][y] for u in units],
    )


def paired_value(
    records: Sequence[DecodeRecord],
    route: str,
    reference: str | None,
    suites: Sequence[str],
    what: tuple[str, str],
) -> float:
    """:func:`compare`'s point estimate alone (no bootstrap); NaN without a pair."""
    sums = paired_sums(records, route, reference, suites, what)
    if not sums[0]:
        return math.nan
    value = float(ratio_of_ratios(*(np.asarray(column, dtype=float) for column in sums)))
    return value if math.isfinite(value) else math.nan


def compare(
    records: Sequence[DecodeRecord], route: str, reference: str, suites: Sequence[str], what: tuple[str, str]
) -> Paired:
    """``route`` over ``reference`` paired per prompt (:func:`paired_sums`) with its interval."""
    return paired_ratio(paired_sums(records, route, reference, suites, what))
