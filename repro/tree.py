"""Draft trees: tokens with parent pointers in topological order.

Node indices are 0-based. ``parents[i] == -1`` means node ``i`` is a child of the committed
prefix (a root-level node); otherwise ``parents[i] < i``. A chain is a tree whose parents are
``i - 1``; plain autoregressive decoding verifies a one-node tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from repro.errors import TreeError

MAX_TREE_NODES = 1024
DRAWS = ("given", "iid", "without_replacement")

Sparse = tuple[torch.Tensor, torch.Tensor]
"""A sparse distribution: (token ids [m], probabilities [m]); mass off the ids is zero."""


@dataclass(frozen=True)
class Tree:
    """A verified-in-one-pass draft tree.

    ``tokens`` and ``parents`` are 1-D int64 tensors of length n.

    ``draw`` says how the children of every node were chosen, which is what a sampling acceptance
    rule needs to stay exact: ``"given"`` (the default: chosen by any rule independent of the
    verifier's randomness, e.g. top-k; rules treat each child as a point mass), ``"iid"`` (drawn
    independently, with replacement, from the node's proposal) or ``"without_replacement"`` (drawn
    one after another from the proposal with earlier siblings' tokens removed, in child order).
    ``proposals[i]`` is the drafter's distribution over node i's children, sparse: ``(ids, probs)``
    (float64; nodes may share one pair, e.g. a depth's marginal); None for a leaf. Required for
    sampled draws; optional (informational) for given ones.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    proposals: tuple[Sparse | None, ...] | None = field(default=None, compare=False)
    draw: str = field(default="given", compare=False)

    def __post_init__(self) -> None:
        tokens = torch.as_tensor(self.tokens, dtype=torch.long).reshape(-1)
        parents = torch.as_tensor(self.parents, dtype=torch.long).reshape(-1)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)
        n = tokens.numel()
        if parents.numel() != n:
            raise TreeError(f"tree has {n} tokens but {parents.numel()} parent pointers")
        if n == 0:
            raise TreeError("tree is empty: a draft tree needs at least one node")
        if n > MAX_TREE_NODES:
            raise TreeError(f"tree too large: {n} nodes (the limit is {MAX_TREE_NODES}); lower the budget")
        idx = torch.arange(n)
        bad = (parents < -1) | (parents >= idx)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            p = int(parents[i])
            if p == i:
                what = "a cycle (a node is its own parent)"
            elif p < -1:
                what = "an invalid parent index (the smallest allowed is -1, the committed prefix)"
            else:
                what = "a parent after its child"
            raise TreeError(
                f"tree node {i} has parent {p}: {what}; nodes must be in topological order "
                "with parent < node (or -1 for the committed prefix)"
            )
        if self.draw not in DRAWS:
            raise TreeError(f"tree draw {self.draw!r} is not one of {', '.join(DRAWS)}")
        if self.proposals is not None and len(self.proposals) != n:
            raise TreeError(f"proposals has {len(self.proposals)} entries for a {n}-node tree")
        if self.draw != "given" and self.proposals is None:
            raise TreeError(f"a tree drawn {self.draw!r} needs the proposal of every inner node")

    @classmethod
    def chain(
        cls,
        tokens: torch.Tensor | list[int],
        proposals: tuple[Sparse | None, ...] | None = None,
        draw: str = "given",
    ) -> Tree:
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        return cls(tokens, torch.arange(tokens.numel()) - 1, proposals, draw)

    @classmethod
    def single(cls, token: int) -> Tree:
        return cls.chain([token])

    def __len__(self) -> int:
        return self.tokens.numel()

    @property
    def size(self) -> int:
        return self.tokens.numel()

    @cached_property
    def depth(self) -> torch.Tensor:
        """Depth per node: 1 for children of the committed prefix."""
        depth = torch.zeros(self.size, dtype=torch.long)
        for i, p in enumerate(self.parents.tolist()):
            depth[i] = 1 if p < 0 else depth[p] + 1
        return depth

    @cached_property
    def ancestor_mask(self) -> torch.Tensor:
        """Bool [n, n]: ``mask[i, j]`` is True when j is on the path to i, i itself included."""
        n = self.size
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                mask[i] = mask[p]
            mask[i, i] = True
        return mask

    @cached_property
    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in range(self.size + 1)]
        for i, p in enumerate(self.parents.tolist()):
            kids[p + 1].append(i)
        return kids

    def children_of(self, node: int) -> list[int]:
        """Children of ``node``; ``node == -1`` gives the root-level nodes."""
        return self.children[node + 1]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root level down to ``node`` inclusive."""
        path = []
        parents = self.parents.tolist()
        while node >= 0:
            path.append(node)
            node = parents[node]
        return path[::-1]

    @property
    def is_chain(self) -> bool:
        return bool(torch.equal(self.parents, torch.arange(self.size) - 1))


@dataclass(frozen=True)
class DeviceTree:
    """A draft tree built on the device and verified there without a host round trip.

    ``tokens`` and ``parents`` are 1-D int64 tensors of ``size`` nodes on the device, in topological
    order (``parents[i] < i`` or -1), as in :class:`Tree`; only ``size`` is known on the host. The GPU
    engine writes them straight into a verify slot; :meth:`to_tree` reads them back (one sync: for the
    eager path, checks and records).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    # ``parents`` is a tensor nobody writes (a chain's, cached per length): a verify slot that already
    # holds that very tensor's values skips copying it again
    constant_parents: bool = False

    def __post_init__(self) -> None:
        if self.tokens.dim() != 1 or self.tokens.shape != self.parents.shape or self.tokens.numel() == 0:
            raise TreeError(
                f"a device tree needs 1-D tokens and parents of one non-zero length, got "
                f"{tuple(self.tokens.shape)} and {tuple(self.parents.shape)}"
            )
        if self.tokens.numel() > MAX_TREE_NODES:
            raise TreeError(f"tree too large: {self.tokens.numel()} nodes (the limit is {MAX_TREE_NODES})")

    @property
    def size(self) -> int:
        return self.tokens.numel()

    def __len__(self) -> int:
        return self.size

    def to_tree(self) -> Tree:
        """The host :class:`Tree` (reads the device; validates the parent pointers)."""
        return Tree(self.tokens.cpu(), self.parents.cpu())


# --------------------------------------------- host helpers of parent pointers (verify slots' inputs)


def ancestor_matrix(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bool [n, n] ancestor-or-self mask, depth [n] with 1 for root-level nodes) of parent pointers
    (Tree.ancestor_mask and Tree.depth, vectorised: one pass per level)."""
    n = parents.shape[0]
    rows = np.arange(n)
    mask = np.zeros((n, n), dtype=np.bool_)
    depth = np.zeros(n, dtype=np.int64)
    node = rows.copy()
    while True:
        inside = node >= 0
        if not inside.any():
            return mask, depth
        mask[rows[inside], node[inside]] = True
        depth += inside
        node = np.where(inside, parents[np.maximum(node, 0)], -1)


def conv_gather_index_np(parents: np.ndarray, width: int) -> np.ndarray:
    """:func:`repro.gdn.reference.conv_gather_index` on the host (NumPy): [n, width] int64."""
    hist = width - 1
    node = np.arange(parents.shape[0])
    back = np.zeros_like(node)
    cols = []
    for _ in range(width):
        inside = node >= 0
        back = back + ~inside
        cols.append(np.where(inside, hist + node, hist - back))
        node = np.where(inside, parents[np.maximum(node, 0)], node)
    return np.stack(cols, axis=1).astype(np.int64)


def first_occurrences(parents: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Per node: is it the first child of its parent with its token (TargetMatch enters that one)."""
    key = (parents + 1) * (int(tokens.max()) + 1) + tokens
    first = np.zeros(parents.shape[0], dtype=np.bool_)
    first[np.unique(key, return_index=True)[1]] = True
    return first
