"""Replayed acceptance: which draft tokens are accepted comes from a stated process, not the target.

Random-weight models at the papers' shapes give real costs but meaningless acceptance. The
:class:`ReplayedAcceptance` rule keeps every cost of a decode step (draft, tree, verify, the
target's picks along the committed path, commit) and replaces only the decision: it ignores the
target's logits and commits the tree's greedy spine (first child at each level) down to a depth
drawn from an :class:`AcceptanceProcess`; the bonus is the target's own (greedy) pick after the
last committed node, as :class:`~repro.decoding.acceptance.TargetMatch` would take it.

An acceptance process is a list of per-depth conditional acceptance probabilities p_1..p_D: draft
depth d is accepted with probability p_d given that depths 1..d-1 were, so the accepted draft count
A has P(A >= d) = p_1 ... p_d and MAL = 1 + sum_d P(A >= d) (bonus included). Sources:

- ``mal:X`` / a paper's MAL: a constant p solved so that 1 + p + ... + p^D = X at the route's draft
  depth D (:func:`constant_p_for_mal`);
- a decode run's records: p_d = (steps with accepted length > d) / (steps with accepted length >= d),
  i.e. the route's measured ``cond_accept_rate`` per depth (:func:`repro.reporting.report.accept_histogram`).

A spine shorter than the drawn depth truncates the draw (counted in ``truncated``). Draws are keyed
by (seed, output position) through :func:`repro.decoding.sampling.step_rng`: reproducible, and
independent across steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from repro.decoding.acceptance import Acceptance, TargetMatch
from repro.decoding.sampling import step_rng
from repro.errors import ConfigError
from repro.tree import Tree


def mal_of(probs: Sequence[float]) -> float:
    """1 + sum_d p_1 ... p_d: the expected accepted length (bonus included) of a process."""
    total, survive = 1.0, 1.0
    for p in probs:
        survive *= p
        total += survive
    return total


def constant_p_for_mal(mal: float, depth: int, tol: float = 1e-12) -> float:
    """The p in [0, 1] with 1 + p + p^2 + ... + p^depth = ``mal`` (bisection; exact at the ends)."""
    if depth < 1:
        raise ConfigError(f"a MAL needs a route with draft tokens (draft depth {depth})")
    if not 1.0 <= mal <= depth + 1:
        raise ConfigError(
            f"MAL {mal:g} is not reachable with {depth} drafts per step (MAL must lie in [1, {depth + 1}])"
        )
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if mal_of([mid] * depth) < mal:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class AcceptanceProcess:
    """Per-depth conditional acceptance probabilities (depth 1 first) and where they come from."""

    source: str
    probs: tuple[float, ...]
    model: str = ""  # how the probabilities were obtained (e.g. "constant p solved for MAL 5.1 at depth 15")

    def __post_init__(self) -> None:
        bad = [p for p in self.probs if not (0.0 <= p <= 1.0)]
        if bad:
            raise ConfigError(f"acceptance probabilities must lie in [0, 1], got {bad[0]!r} ({self.source})")

    @property
    def depth(self) -> int:
        return len(self.probs)

    @property
    def mal(self) -> float:
        return mal_of(self.probs)

    def draw(self, rng: np.random.Generator) -> int:
        """Accepted draft count: consecutive successes, depth d accepted with probability p_d."""
        u = rng.random(len(self.probs))
        for d, (x, p) in enumerate(zip(u, self.probs)):
            if x >= p:
                return d
        return len(self.probs)

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "model": self.model, "probs": list(self.probs), "mal": self.mal}

    @classmethod
    def for_mal(cls, mal: float, depth: int, source: str) -> AcceptanceProcess:
        p = constant_p_for_mal(mal, depth)
        return cls(
            source,
            (p,) * depth,
            f"constant per-depth p = {p:.4f} solved for MAL {mal:g} at draft depth {depth}",
        )


@dataclass(eq=False)  # identity: a rule keys its device twin (repro.decoding.device_acceptance) and counts
class ReplayedAcceptance(TargetMatch):
    """Greedy-spine acceptance to a depth drawn from ``process``; target logits only give the bonus.

    ``steps`` / ``truncated`` count the steps accepted and those whose drawn depth the spine could
    not hold (:meth:`reset` zeroes them).
    """

    process: AcceptanceProcess
    seed: int = 0
    temperature: float = 0.0
    steps: int = 0
    truncated: int = 0

    def reset(self) -> None:
        self.steps = self.truncated = 0

    def accept(
        self, tree: Tree, logits: torch.Tensor, position: int, rng: np.random.Generator | None = None
    ) -> Acceptance:
        """``rng`` is not used: the depth is drawn from the step stream of (stream, ``position``)."""
        want = self.process.draw(step_rng(self.stream, position))
        node, path = 0, [0]
        while len(path) <= want:
            kids = tree.children_of(node)
            if not kids:
                self.truncated += 1
                break
            node = kids[0]
            path.append(node)
        choice = 0
        for i, n in enumerate(path):  # the target's pick at every committed node, as TargetMatch's walk
            choice = self.pick(logits[n], position + i)
        self.steps += 1
        return Acceptance(path, choice)
