"""Tree builders: turn a drafter's proposal into the tree the target verifies.

Every tree is rooted at node 0, the pending token; draft nodes hang below it. Builders that read
per-depth marginals (``Chain``, ``Backbone``, ``BestFirst``) record each node's proposal (its
children's depth marginal, shared by the nodes of one depth) in ``Tree.proposals``. With
``sample=True`` they draw the tokens from the marginals instead of taking the top ones, keeping
the tree's shape a function of the marginals alone: the exactness of the sampling acceptance
rules needs children drawn from the recorded proposal whatever happens elsewhere in the tree
(docs/metrics.md). Sampling needs marginals that do not depend on earlier draft tokens (DFlash's).
"""

from __future__ import annotations

import heapq
from typing import Protocol

import numpy as np
import torch

from repro.drafters.base import Proposal
from repro.errors import ConfigError
from repro.tree import MAX_TREE_NODES, Sparse, Tree

Rng = np.random.Generator | None


class TreeBuilder(Protocol):
    def build(self, root_token: int, proposal: Proposal | None, rng: Rng = None) -> Tree: ...


def depth_marginals(proposal: Proposal | None) -> list[Sparse]:
    """Per depth (depth 1 first), the drafter's marginal as a sparse (ids, probs) float64 pair."""
    if proposal is None or proposal.probs is None:
        return []
    rows = proposal.probs.detach().to("cpu", torch.float64)
    ids = torch.arange(rows.shape[-1])
    return [(ids, row) for row in rows]


def draw_without_replacement(probs: torch.Tensor, m: int, rng: np.random.Generator) -> list[int]:
    """``m`` distinct tokens drawn one after another from ``probs`` (earlier ones removed), in draw
    order (Gumbel top-m: the same law as successive sampling); fewer if the support is smaller."""
    logp = np.log(probs.numpy())
    keys = logp + rng.gumbel(size=logp.size)
    m = min(m, int(np.isfinite(logp).sum()))
    top = np.argpartition(-keys, m - 1)[:m] if m < keys.size else np.arange(keys.size)
    return top[np.argsort(-keys[top], kind="stable")][:m].tolist()


def _need_rng(rng: Rng) -> np.random.Generator:
    if rng is None:
        raise ValueError("a sampling tree builder needs the step's random generator")
    return rng


def _need_marginals(proposal: Proposal) -> list[Sparse]:
    marg = depth_marginals(proposal)
    if len(marg) < proposal.depth:
        raise ConfigError("sampled draft trees need the drafter's per-depth marginals (proposal.probs)")
    return marg


class SingleNode:
    """Autoregressive decoding: the pending token alone."""

    def build(self, root_token: int, proposal: Proposal | None, rng: Rng = None) -> Tree:
        return Tree.single(root_token)


class Chain:
    """The first choice at every depth, as a chain below the root; ``sample``: one token drawn
    from each depth's marginal."""

    def __init__(self, sample: bool = False) -> None:
        self.sample = sample

    def build(self, root_token: int, proposal: Proposal | None, rng: Rng = None) -> Tree:
        if proposal is None or proposal.depth == 0:
            return Tree.single(root_token)
        if not self.sample:
            marg = depth_marginals(proposal)
            tokens = [root_token] + [c[0] for c in proposal.candidates]
            return Tree.chain(tokens, (tuple(marg) + (None,)) if marg else None)
        marg = _need_marginals(proposal)
        gen = _need_rng(rng)
        tokens = [root_token] + [draw_without_replacement(q, 1, gen)[0] for _, q in marg]
        return Tree.chain(tokens, tuple(marg) + (None,), "iid")


class DrafterTree:
    """The tree the drafter grew itself (``proposal.tree``); its root must be the pending token."""

    def build(self, root_token: int, proposal: Proposal | None, rng: Rng = None) -> Tree:
        if proposal is None or proposal.tree is None:
            return Tree.single(root_token)
        tree = proposal.tree
        if int(tree.tokens[0]) != root_token or int(tree.parents[0]) != -1:
            raise ValueError("the drafter's tree must be rooted at the pending token (node 0)")
        return tree


class Backbone:
    """Siblings at every depth under the first choice of the depth above (a 'caterpillar').

    At depth d the top-``width`` candidates become children of the previous depth's first
    choice, so a hit on a later sibling ends the walk one level deeper. ``sample``: the ``width``
    siblings of depth d are drawn without replacement from depth d's marginal instead.
    """

    def __init__(self, width: int, sample: bool = False) -> None:
        if width < 1:
            raise ConfigError(f"tree width must be >= 1, got {width}")
        self.width, self.sample = width, sample

    def build(self, root_token: int, proposal: Proposal | None, rng: Rng = None) -> Tree:
        levels = proposal.candidates if proposal else []
        marg = _need_marginals(proposal) if self.sample and proposal else depth_marginals(proposal)
        if self.sample and proposal:
            gen = _need_rng(rng)
            levels = [draw_without_replacement(q, self.width, gen) for _, q in marg[: len(levels)]]
        tokens, parents = [root_token], [-1]
        props: list[Sparse | None] = [marg[0] if marg else None]
        spine = 0
        for d, level in enumerate(levels):
            first = len(tokens)
            for tok in level[: self.width]:
                tokens.append(tok)
                parents.append(spine)
                props.append(None)
            if first < len(tokens) and d + 1 < len(marg) and d + 1 < len(levels):
                props[first] = marg[d + 1]
            spine = first
        draw = "without_replacement" if self.sample and proposal else "given"
        return Tree(tokens, parents, tuple(props) if marg else None, draw)


class BestFirst:
    """DDTree: the ``budget`` most probable draft nodes under the drafter's per-depth marginals.

    A node's score is the summed log-probability of its path, each depth's marginal
    (``proposal.probs[d]``) taken independently; only the top-``budget`` tokens of each depth
    can appear. A max-heap starts with the best token at depth 1; each pop adds that node, then
    pushes its next sibling (next rank, same parent) and its first child (rank 0, next depth).
    ``budget`` counts draft nodes, not the root: the tree has at most ``budget + 1`` nodes (fewer
    only when the top-k tokens of every depth run out). Nodes come out in pop order, so parents
    precede children, siblings are in decreasing probability and scores never increase with the
    node index; ties pop in push order.

    ``sample``: the shape stays the best-first tree's (a function of the marginals alone); each
    node's children are then drawn without replacement from their depth's marginal, afresh per
    parent, in child order.
    """

    def __init__(self, budget: int, sample: bool = False) -> None:
        if not 1 <= budget < MAX_TREE_NODES:
            raise ConfigError(f"tree budget must lie in [1, {MAX_TREE_NODES - 1}] draft nodes, got {budget}")
        self.budget, self.sample = budget, sample

    def build(self, root_token: int, proposal: Proposal | None, rng: Rng = None) -> Tree:
        tree = self._top(root_token, proposal)
        if tree.size == 1:
            return tree
        marg = depth_marginals(proposal)
        depth = tree.depth.tolist()  # the root is depth 1
        kids = [tree.children_of(i) for i in range(tree.size)]
        props = tuple(marg[depth[i] - 1] if kids[i] else None for i in range(tree.size))
        if not self.sample:
            return Tree(tree.tokens, tree.parents, props)
        gen = _need_rng(rng)
        tokens = tree.tokens.clone()
        for i, children in enumerate(kids):
            if children:
                tokens[children] = torch.tensor(draw_without_replacement(props[i][1], len(children), gen))
        return Tree(tokens, tree.parents, props, "without_replacement")

    def _top(self, root_token: int, proposal: Proposal | None) -> Tree:
        if proposal is None or proposal.depth == 0:
            return Tree.single(root_token)
        if proposal.probs is None:
            raise ConfigError("best-first (DDTree) trees need the drafter's marginals (proposal.probs)")
        depth, vocab = proposal.probs.shape
        k = min(self.budget, vocab)
        top_p, top_ids = torch.topk(proposal.probs.detach(), k, dim=-1)  # on the drafter's device
        logp = top_p.to("cpu", torch.float64).clamp_min(torch.finfo(torch.float64).tiny).log().tolist()
        ids = top_ids.tolist()
        tokens, parents = [root_token], [-1]
        pushes = 0
        # entries: (-score, push order, depth index, rank, parent node, parent's score)
        heap: list[tuple[float, int, int, int, int, float]] = [(-logp[0][0], 0, 0, 0, 0, 0.0)]
        while heap and len(tokens) <= self.budget:
            neg, _, d, r, parent, base = heapq.heappop(heap)
            node = len(tokens)
            tokens.append(ids[d][r])
            parents.append(parent)
            if r + 1 < k:
                pushes += 1
                heapq.heappush(heap, (-(base + logp[d][r + 1]), pushes, d, r + 1, parent, base))
            if d + 1 < depth:
                pushes += 1
                heapq.heappush(heap, (neg - logp[d + 1][0], pushes, d + 1, 0, node, -neg))
        return Tree(tokens, parents)
