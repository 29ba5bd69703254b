"""Tree builders: turn a drafter's proposal into the tree the target verifies.

Every tree is rooted at node 0, the pending token; draft nodes hang below it.
"""

from __future__ import annotations

from typing import Protocol

from repro.drafters.base import Proposal
from repro.errors import ConfigError
from repro.tree import Tree


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
