"""The replayed acceptance rule: its depth law, the MAL -> p solver, the greedy spine and the bonus."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from repro.decoding.replayed import AcceptanceProcess, ReplayedAcceptance, constant_p_for_mal, mal_of
from repro.decoding.sampling import step_rng
from repro.errors import ConfigError
from repro.tree import Tree


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


def depth_law(probs: list[float]) -> np.ndarray:
    """P(A = a) for a = 0..D under per-depth conditional acceptance ``probs``."""
    out, survive = [], 1.0
    for p in probs:
        out.append(survive * (1 - p))
        survive *= p
    return np.array([*out, survive])


def deep_chain(depth: int) -> Tree:
    """A root with a chain of ``depth`` drafts, and a sibling under every spine node (never taken)."""
    tokens, parents = [0], [-1]
    spine = 0
    for d in range(depth):
        tokens += [10 + d, 100 + d]
        parents += [spine, spine]
        spine = len(tokens) - 2
    return Tree(tokens, parents)


def replay_depths(rule: ReplayedAcceptance, tree: Tree, steps: int, vocab: int = 200) -> np.ndarray:
    logits = torch.zeros(tree.size, vocab)
    return np.array([rule.accept(tree, logits, pos).accepted_drafts for pos in range(steps)])


# chi-square 0.999 quantiles for 5 and 7 degrees of freedom
CHI2_999 = {5: 20.52, 7: 24.32}


def test_accepted_depths_follow_the_stated_per_depth_probabilities():
    probs = [0.9, 0.8, 0.7, 0.6, 0.5]
    rule = ReplayedAcceptance(process=AcceptanceProcess("test", tuple(probs)), seed=3)
    depths = replay_depths(rule, deep_chain(8), 20_000)
    counts = np.bincount(depths, minlength=len(probs) + 1)
    assert chi_square(counts, depth_law(probs)) < CHI2_999[5]
    assert abs(1 + depths.mean() - mal_of(probs)) < 0.03
    # per-depth conditional acceptance measured like the harness's cond_accept_rate
    for d, p in enumerate(probs, start=1):
        reached, beyond = (depths >= d - 1).sum(), (depths >= d).sum()
        assert abs(beyond / reached - p) < 4 * math.sqrt(p * (1 - p) / reached)


def test_negative_control_other_probabilities_are_rejected():
    stated, actual = [0.9, 0.8, 0.7, 0.6, 0.5], [0.85, 0.8, 0.7, 0.6, 0.5]
    rule = ReplayedAcceptance(process=AcceptanceProcess("control", tuple(actual)), seed=3)
    counts = np.bincount(replay_depths(rule, deep_chain(8), 20_000), minlength=6)
    assert chi_square(counts, depth_law(stated)) > CHI2_999[5]


def test_draws_are_reproducible_per_seed_and_position():
    process = AcceptanceProcess("t", (0.7,) * 7)
    a = ReplayedAcceptance(process=process, seed=5)
    b = ReplayedAcceptance(process=process, seed=5)
    tree = deep_chain(7)
    assert list(replay_depths(a, tree, 300)) == list(replay_depths(b, tree, 300))
    assert list(replay_depths(ReplayedAcceptance(process=process, seed=6), tree, 300)) != list(
        replay_depths(a, tree, 300)
    )
    assert process.draw(step_rng(5, 17)) == process.draw(step_rng(5, 17))  # no global state read
    assert len({process.draw(step_rng(5, step)) for step in range(60)}) > 2  # the step's key does draw


def test_the_spine_is_followed_and_the_bonus_is_the_targets_pick():
    tree = deep_chain(4)
    logits = torch.zeros(tree.size, 50)
    for node in range(tree.size):
        logits[node, node % 50] = 1.0  # the target's greedy pick at node n is token n
    rule = ReplayedAcceptance(process=AcceptanceProcess("all", (1.0,) * 4), seed=0)
    acc = rule.accept(tree, logits, 0)
    assert acc.path == [0, 1, 3, 5, 7]  # first child at every level, never the siblings
    assert acc.bonus == 7
    none = ReplayedAcceptance(process=AcceptanceProcess("none", (0.0,) * 4), seed=0).accept(tree, logits, 0)
    assert none.path == [0] and none.bonus == 0


def test_a_short_spine_truncates_and_is_counted():
    rule = ReplayedAcceptance(process=AcceptanceProcess("all", (1.0,) * 6), seed=0)
    tree = Tree([0, 1, 2, 3], [-1, 0, 0, 1])  # spine depth 2
    acc = rule.accept(tree, torch.zeros(4, 8), 0)
    assert acc.path == [0, 1, 3] and rule.truncated == 1 and rule.steps == 1
    rule.reset()
    assert rule.truncated == rule.steps == 0


@pytest.mark.parametrize("depth", [1, 4, 15])
@pytest.mark.parametrize("frac", [0.0, 0.3, 0.77, 1.0])
def test_constant_p_solves_the_mal(depth, frac):
    mal = 1 + frac * depth
    p = constant_p_for_mal(mal, depth)
    assert 0.0 <= p <= 1.0
    assert mal_of([p] * depth) == pytest.approx(mal, abs=1e-9)
    process = AcceptanceProcess.for_mal(mal, depth, "mal")
    assert process.mal == pytest.approx(mal, abs=1e-9) and process.depth == depth
    assert "solved for MAL" in process.model


def test_solver_closed_form_and_bad_input():
    # 1 + p + p^2 = 2.75 at p = 0.5 + ... : check against the closed form (1 - p^3) / (1 - p)
    p = constant_p_for_mal(1.75, 2)
    assert (1 - p**3) / (1 - p) == pytest.approx(1.75)
    assert p == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="not reachable"):
        constant_p_for_mal(17.0, 15)
    with pytest.raises(ConfigError, match="draft tokens"):
        constant_p_for_mal(2.0, 0)
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        AcceptanceProcess("bad", (1.2,))
