"""Tree builders: turn a drafter's proposal into the tree the target verifies.

Every tree is rooted at node 0, the pending token; draft nodes hang below it.
"""

from __future__ import annotations

import heapq
from typing import Protocol

import torch

from repro.drafters.base import Proposal
from repro.errors import ConfigError
from repro.tree import MAX_TREE_NODES, Tree


class TreeBuilder(Protocol):
    def build(self, root_token: int, proposal: Proposal | None) -> Tree: ...


class SingleNode:
    """Autoregressive decoding: the pending token alone."""

    def build(self, root_token: int, proposal: Proposal | None) -> Tree:
        return Tree.single(root_token)


class Chain:
    """The first choice at every depth, as a chain below the root."""

    def build(self, root_token: int, proposal: Proposal | None) -> Tree:
        tokens = [root_token] + ([c[0] for c in proposal.candidates] if proposal else [])
        return Tree.chain(tokens)


class DrafterTree:
    """The tree the drafter grew itself (``proposal.tree``); its root must be the pending token."""

    def build(self, root_token: int, proposal: Proposal | None) -> Tree:
        if proposal is None or proposal.tree is None:
            return Tree.single(root_token)
        tree = proposal.tree
        if int(tree.tokens[0]) != root_token or int(tree.parents[0]) != -1:
            raise ValueError("the drafter's tree must be rooted at the pending token (node 0)")
        return tree


class Backbone:
    """Siblings at every depth under the first choice of the depth above (a 'caterpillar').

    At depth d the top-``width`` candidates become children of the previous depth's first
    choice, so a hit on a later sibling ends the walk one level deeper.
    """

    def __init__(self, width: int) -> None:
        if width < 1:
            raise ConfigError(f"tree width must be >= 1, got {width}")
        self.width = width

    def build(self, root_token: int, proposal: Proposal | None) -> Tree:
        tokens, parents = [root_token], [-1]
        spine = 0
        for level in proposal.candidates if proposal else []:
            first = len(tokens)
            for tok in level[: self.width]:
                tokens.append(tok)
                parents.append(spine)
            spine = first
        return Tree(tokens, parents)


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
    """

    def __init__(self, budget: int) -> None:
        if not 1 <= budget < MAX_TREE_NODES:
            raise ConfigError(f"tree budget must lie in [1, {MAX_TREE_NODES - 1}] draft nodes, got {budget}")
        self.budget = budget

    def build(self, root_token: int, proposal: Proposal | None) -> Tree:
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
