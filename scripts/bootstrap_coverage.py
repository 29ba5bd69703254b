"""How often the paired percentile-bootstrap 95% interval (repro.reporting.stats) holds the true pooled
speedup, by number of prompts: a simulation behind docs/metrics.md's caveat.

Prompts of 60-260 tokens, AR at 7000-9000 tok/s, per-prompt speedups log-normal around 1.6x (sd 0.35 in
log): the true value is the statistic on two million prompts. Usage: python scripts/bootstrap_coverage.py
[REPS] (default 300 per n; a few minutes on one core).
"""

from __future__ import annotations

import sys

import numpy as np
from scipy.stats import bootstrap

from repro.reporting.stats import ratio_of_ratios


def draw(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    tokens = rng.integers(60, 260, n).astype(float)
    ar_s = tokens / rng.uniform(7000, 9000, n)
    speed = np.exp(rng.normal(np.log(1.6), 0.35, n))
    return [tokens, ar_s / speed, tokens, ar_s]


def main(reps: int) -> None:
    rng = np.random.default_rng(0)
    truth = float(ratio_of_ratios(*draw(rng, 2_000_000)))
    for n in (5, 8, 12, 20):
        hits = {"percentile": 0, "BCa": 0}
        for _ in range(reps):
            data = draw(rng, n)
            for method in hits:
                kw = {"paired": True, "vectorized": True, "n_resamples": 2000, "method": method, "rng": rng}
                ci = bootstrap(data, ratio_of_ratios, **kw).confidence_interval
                hits[method] += int(ci.low <= truth <= ci.high)
        print(f"n = {n}: " + ", ".join(f"{m} {h / reps:.3f}" for m, h in hits.items()), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
