"""Layer shapes and benchmark draft trees.

Trees are parent lists in repro's convention (:mod:`repro.tree`): node 0 is the root (parent
-1, the pending token) and every other node's parent precedes it.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import dataclass

import torch

TREE_KINDS = ("draft", "chain")
RANDOM_TREE_KINDS = ("random", "chain", "fan", "mixed", "forest")


@dataclass(frozen=True)
class LayerShape:
    """One GDN layer: H key heads, HV value heads, key and value head dims."""

    name: str
    h: int
    hv: int
    dk: int
    dv: int

    @property
    def scale(self) -> float:
        return self.dk**-0.5


SHAPES = {
    "weaver": LayerShape("weaver", h=16, hv=48, dk=128, dv=128),  # Qwen3.6-27B GDN layer (paper A)
    "specla": LayerShape("specla", h=8, hv=8, dk=256, dv=256),  # GDN-1.3B layer (paper B)
    "tiny-qwen35": LayerShape("tiny-qwen35", h=2, hv=4, dk=48, dv=48),  # the embedded family's GDN layer
}


def chain_tree(n: int) -> list[int]:
    """One path of n nodes."""
    return list(range(-1, n - 1))


def draft_tree(n: int, seed: int, max_depth: int = 16, branching: int = 4, alpha: float = 0.15) -> list[int]:
    """A best-first draft tree of n nodes, as a drafter with a node budget grows it.

    Every node offers ``branching`` children whose probabilities are the largest entries of a
    Dirichlet(alpha) draw over branching + 1 outcomes (small alpha: a confident drafter); the
    tree repeatedly adds the offered child with the highest path probability, never below
    ``max_depth``. Deterministic in ``seed``.
    """
    if n < 1:
        raise ValueError(f"a tree needs at least one node, got n={n}")
    rng = random.Random(seed)
    parents, depth, logp = [-1], [1], [0.0]
    frontier: list[tuple[float, int, int]] = []
    order = itertools.count()  # ties go to the earlier offer

    def offer(node: int) -> None:
        if depth[node] >= max_depth:
            return
        draws = [rng.gammavariate(alpha, 1.0) + 1e-12 for _ in range(branching + 1)]
        total = sum(draws)
        for p in sorted(draws, reverse=True)[:branching]:
            heapq.heappush(frontier, (-(logp[node] + math.log(p / total)), next(order), node))

    offer(0)
    while len(parents) < n:
        if not frontier:
            raise ValueError(f"no {n}-node tree fits max_depth={max_depth}, branching={branching}")
        neg, _, node = heapq.heappop(frontier)
        parents.append(node)
        depth.append(depth[node] + 1)
        logp.append(-neg)
        offer(len(parents) - 1)
    return parents


def random_parents(n: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """Parent pointers [n] (int64, parents[i] < i, -1 for root-level nodes) of a random tree.

    - ``random``: each node hangs under a uniformly chosen earlier node (ancestors interact:
      branches share prefixes and interleave in node order);
    - ``chain``: one path, parents[i] = i - 1;
    - ``fan``: one root-level node with n - 1 children;
    - ``mixed``: mostly continues the previous node, sometimes branches off an earlier one, so
      it has both deep paths and siblings interleaved in node order;
    - ``forest``: like ``random`` but several nodes hang directly under the committed prefix.
    """
    if kind == "chain":
        return torch.arange(n) - 1
    parents = torch.full((n,), -1, dtype=torch.long)
    for i in range(1, n):
        u = float(torch.rand((), generator=gen))
        if kind == "fan":
            parents[i] = 0
        elif kind == "random":
            parents[i] = int(torch.randint(0, i, (), generator=gen))
        elif kind == "mixed":
            parents[i] = i - 1 if u < 0.6 else int(torch.randint(-1, i - 1, (), generator=gen))
        elif kind == "forest":
            parents[i] = -1 if u < 0.15 else int(torch.randint(0, i, (), generator=gen))
        else:
            raise ValueError(f"unknown tree kind {kind!r}")
    return parents


def make_tree(kind: str, n: int, seed: int) -> list[int]:
    """A benchmark tree of the given kind ("draft" or "chain") and node count."""
    if kind == "chain":
        return chain_tree(n)
    if kind == "draft":
        return draft_tree(n, seed)
    raise ValueError(f"unknown tree kind {kind!r}; known: {', '.join(TREE_KINDS)}")


def depths(parents: list[int]) -> list[int]:
    """Depth per node (1 for the root level)."""
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def flatten_paths(parents: list[int]) -> list[list[int]]:
    """Root-to-leaf paths, one per leaf, leaves in increasing node order.

    Per-branch verification runs the recurrence once over each path from the committed state;
    concatenated, the paths are the varlen batch (cu_seqlens) of flash-linear-attention.
    """
    has_child = {p for p in parents if p >= 0}
    paths = []
    for leaf in (i for i in range(len(parents)) if i not in has_child):
        path, node = [], leaf
        while node >= 0:
            path.append(node)
            node = parents[node]
        paths.append(path[::-1])
    return paths


def deepest_path(parents: list[int], length: int) -> list[int]:
    """The first ``length`` nodes of the longest root-to-leaf path (the first such leaf on ties)."""
    path = max(flatten_paths(parents), key=len)
    if len(path) < length:
        raise ValueError(f"the tree is {len(path)} deep; no accepted path of depth {length}")
    return path[:length]
