"""Acceptance rules: which path of a verified tree is committed, and the bonus token.

Every tree the engine verifies has its root at node 0: the pending token (the last generated
token, not yet folded into the state). The root is always committed. Rules:

- ``greedy`` / ``sample_match`` (:class:`TargetMatch`): the target picks its token at each node
  (argmax, or a sample keyed by the output position, exactly AR's); a child carrying it is
  accepted and the walk goes on; the target's pick where no child matches is the bonus.
- ``spec_sampling`` (:class:`SpecSampling`): multi-draft speculative sampling, top-down: recursive
  rejection over a node's children against the residual target distribution.
- ``traversal`` (:class:`Traversal`): Traversal Verification, bottom-up: sequence-level
  acceptance weights, children visited depth first, a node decided after its subtree.

The two sampling rules use the distribution each child was drawn from (``Tree.draw`` and
``Tree.proposals``): a point mass for given (e.g. top-k) children. docs/metrics.md states both
algorithms and why they are exact; tests/decoding/test_acceptance_exact.py checks it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from repro.decoding.sampling import generation_seed, pick_token, probs_row, sample_index, target_probs
from repro.errors import ConfigError
from repro.tree import Sparse, Tree

Row = Callable[[int], np.ndarray]  # node -> the target's next-token distribution there (float64 [V])
Proposal = Callable[[int], np.ndarray | None]  # node -> the dense proposal of its children
Rand = Callable[[], float]  # a U[0, 1) draw


@dataclass
class Acceptance:
    path: list[int]  # committed nodes, root first
    bonus: int  # the target's token after the last committed node

    @property
    def accepted_drafts(self) -> int:
        return len(self.path) - 1


class TargetMatch:
    """Target-sample-then-match: lossless at any temperature; greedy longest match at T=0.

    At each node the target picks its token (argmax, or a sample keyed by the output
    position); a child carrying that token is accepted and the walk goes on.
    """

    _stream: int | None = None  # the current generation's seed (begin); None: the run's seed

    def __init__(self, temperature: float, seed: int) -> None:
        self.temperature = temperature
        self.seed = seed

    @property
    def stream(self) -> int:
        """The seed of the current generation's draws (:meth:`begin`)."""
        return self.seed if self._stream is None else self._stream

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Before a generation: its draws keyed by the prompt too (:func:`~repro.decoding.sampling.
        generation_seed`), so every route on one prompt draws AR's numbers and two prompts independent
        ones."""
        self._stream = generation_seed(self.seed, prompt_ids)

    def pick(self, logits: torch.Tensor, position: int) -> int:
        return pick_token(logits, self.temperature, self.stream, position)

    def accept(
        self, tree: Tree, logits: torch.Tensor, position: int, rng: np.random.Generator | None = None
    ) -> Acceptance:
        """``position`` is the output index that the root's logits predict (``rng`` is not used)."""
        node, path = 0, [0]
        tokens = tree.tokens.tolist()
        while True:
            choice = self.pick(logits[node], position + len(path) - 1)
            nxt = next((c for c in tree.children_of(node) if tokens[c] == choice), None)
            if nxt is None:
                return Acceptance(path, choice)
            path.append(nxt)
            node = nxt


# --------------------------------------------------------------------------- the sampling rules


def child_dist(
    draw: str, proposal: np.ndarray | None, earlier: list[int], token: int, vocab: int
) -> np.ndarray:
    """The distribution (dense [V]) a child carrying ``token`` was drawn from, given the tokens
    of its ``earlier`` siblings: a point mass (``given``), the proposal (``iid``) or the proposal
    without the earlier tokens, renormalised (``without_replacement``)."""
    if draw == "given":
        out = np.zeros(vocab)
        out[token] = 1.0
        return out
    assert proposal is not None  # Tree refuses sampled draws without proposals
    if draw == "iid" or not earlier:
        out = proposal
    else:
        out = proposal.copy()
        out[earlier] = 0.0
    total = out.sum()
    if not out[token] > 0.0:
        raise ValueError(f"child token {token} has no proposal mass: it cannot have been drawn from it")
    return out / total


def residual(r: np.ndarray, q: np.ndarray, weight: float = 1.0) -> tuple[np.ndarray, float]:
    """``norm(max(weight * r - q, 0))`` and the mass before normalising (r unchanged if it is 0)."""
    m = np.maximum(weight * r - q, 0.0)
    s = float(m.sum())
    return (m / s if s > 0.0 else r), s


def spec_walk(
    tokens: list[int],
    children: Callable[[int], list[int]],
    row: Row,
    draw: str,
    proposal: Proposal,
    rand: Rand,
) -> tuple[list[int], int]:
    """Multi-draft speculative sampling down the tree: (committed path, bonus token).

    At node u with target residual r (first the target's distribution): for each child c_i in
    order, drawn from Q_i (:func:`child_dist`), accept c_i with probability min(1, r(c_i) / Q_i(c_i))
    and go down into it with r = the target at c_i; else r = norm(max(r - Q_i, 0)) and try the next
    child. When every child is rejected the bonus is drawn from r.
    """
    node, path, r = 0, [0], row(0)
    while True:
        earlier: list[int] = []
        for c in children(node):
            t = tokens[c]
            q = child_dist(draw, proposal(node), earlier, t, r.size)
            if rand() * q[t] < r[t]:
                node, r = c, row(c)
                path.append(c)
                break
            r = residual(r, q)[0]
            earlier.append(t)
        else:
            return path, sample_index(r, rand())


def traversal_walk(
    tokens: list[int],
    children: Callable[[int], list[int]],
    row: Row,
    draw: str,
    proposal: Proposal,
    rand: Rand,
) -> tuple[list[int], int]:
    """Traversal verification: (committed path, bonus token).

    Each node u on the depth-first stack holds a weight w_u (the root's is 1) and a target
    residual r_u (first the target's distribution at u). Entering child c_i of u, drawn from Q_i:
    w_c = min(1, w_u r_u(c_i) / Q_i(c_i)). A node whose children are all decided (a leaf at once)
    is accepted with probability w_u: the path to it is committed and the bonus drawn from r_u;
    else it is rejected and its parent p updates with the child's Q: m = max(w_p r_p - Q, 0),
    S = sum(m), r_p = m / S, w_p = S / (1 - w_p + S). The root (w = 1 throughout) always accepts.
    """
    # frames: [node, weight, residual, next child index, earlier children's tokens, current child's Q]
    stack: list[list] = [[0, 1.0, row(0), 0, [], None]]
    while True:
        frame = stack[-1]
        node, w, r, k, earlier = frame[0], frame[1], frame[2], frame[3], frame[4]
        kids = children(node)
        if k < len(kids):
            c = kids[k]
            t = tokens[c]
            q = child_dist(draw, proposal(node), earlier, t, r.size)
            frame[5] = q
            wc = min(1.0, w * r[t] / q[t])
            if wc > 0.0:
                stack.append([c, wc, row(c), 0, [], None])
                continue
            child = c  # weight 0: the whole subtree is rejected without a draw
        elif len(stack) == 1 or rand() < w:
            return [f[0] for f in stack], sample_index(r, rand())
        else:
            stack.pop()
            child, frame = node, stack[-1]
        frame[2], s = residual(frame[2], frame[5], frame[1])
        frame[1] = s / (1.0 - frame[1] + s) if s > 0.0 else 0.0
        frame[4].append(tokens[child])
        frame[3] += 1


Walk = Callable[[list[int], Callable[[int], list[int]], Row, str, Proposal, Rand], tuple[list[int], int]]


def dense_proposals(tree: Tree, vocab: int) -> Proposal:
    """node -> its proposal as a dense float64 [V] array (None without one); shared pairs densified once."""
    props = tree.proposals or (None,) * tree.size
    cache: dict[int, np.ndarray] = {}

    def get(node: int) -> np.ndarray | None:
        pair: Sparse | None = props[node]
        if pair is None:
            return None
        key = id(pair[1])
        if key not in cache:
            dense = np.zeros(vocab)
            dense[pair[0].cpu().numpy()] = pair[1].to("cpu", torch.float64).numpy()
            cache[key] = dense
        return cache[key]

    return get


class SamplingRule(TargetMatch):
    """A rule that accepts by draft probabilities: lossless in distribution, reproducible by seed.

    The first token (from prefill) is AR's position-keyed pick; each step draws from
    :func:`repro.decoding.sampling.step_rng` (stream, root position), after the tree builder: the caller
    passes that stream on (``rng``, required), past the builder's draws.
    """

    walk: Walk

    def accept(  # type: ignore[override]
        self, tree: Tree, logits: torch.Tensor, position: int, rng: np.random.Generator
    ) -> Acceptance:
        """``rng``: the step's stream after a sampling builder's draws. Required, with no fallback: a fresh
        ``step_rng(stream, position)`` would replay the very draws the builder made its children from (the
        acceptance tests then correlate with the children: biased)."""
        if rng is None:
            raise ValueError("a sampling rule needs the step's random generator, after the builder's draws")
        if self.temperature > 0:
            rows = target_probs(logits, self.temperature).cpu().numpy()
        else:
            rows = np.stack([probs_row(row, 0.0) for row in logits])
        tokens = tree.tokens.tolist()
        path, bonus = type(self).walk(
            tokens,
            tree.children_of,
            rows.__getitem__,
            tree.draw,
            dense_proposals(tree, rows.shape[-1]),
            rng.random,
        )
        return Acceptance(path, bonus)


class SpecSampling(SamplingRule):
    """Multi-draft speculative sampling over the tree (:func:`spec_walk`)."""

    walk = staticmethod(spec_walk)


class Traversal(SamplingRule):
    """Traversal verification (:func:`traversal_walk`)."""

    walk = staticmethod(traversal_walk)


ACCEPTANCE_RULES = ("greedy", "sample_match", "spec_sampling", "traversal")
DISTRIBUTIONAL_RULES = ("spec_sampling", "traversal")  # lossless in distribution, not token for token


def make_rule(name: str, temperature: float, seed: int) -> TargetMatch:
    """``greedy``: argmax matching (temperature must be 0); ``sample_match``: sample then match;
    ``spec_sampling`` and ``traversal``: the sampling rules (at temperature 0 they reduce to greedy)."""
    if name == "greedy":
        if temperature > 0:
            raise ConfigError("acceptance 'greedy' needs temperature 0; use 'sample_match' for sampling")
        return TargetMatch(0.0, seed)
    if name == "sample_match":
        return TargetMatch(temperature, seed)
    if name == "spec_sampling":
        return SpecSampling(temperature, seed)
    if name == "traversal":
        return Traversal(temperature, seed)
    raise ConfigError(f"unknown acceptance rule {name!r}: choose one of {', '.join(ACCEPTANCE_RULES)}")
