"""Acceptance rules: which path of a verified tree is committed, and the bonus token.

Every tree the engine verifies has its root at node 0: the pending token (the last generated
token, not yet folded into the state). The root is always committed; the rule walks down from
it, following the child whose token matches the target's own choice at the current node, and
the target's choice where no child matches becomes the bonus token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from repro.decoding.sampling import pick_token
from repro.errors import ConfigError
from repro.tree import Tree


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

    def __init__(self, temperature: float, seed: int) -> None:
        self.temperature = temperature
        self.seed = seed

    def pick(self, logits: torch.Tensor, position: int) -> int:
        return pick_token(logits, self.temperature, self.seed, position)

    def accept(self, tree: Tree, logits: torch.Tensor, position: int) -> Acceptance:
        """``position`` is the output index that the root's logits predict."""
        node, path = 0, [0]
        tokens = tree.tokens.tolist()
        while True:
            choice = self.pick(logits[node], position + len(path) - 1)
            nxt = next((c for c in tree.children_of(node) if tokens[c] == choice), None)
            if nxt is None:
                return Acceptance(path, choice)
            path.append(nxt)
            node = nxt


ACCEPTANCE_RULES = ("greedy", "sample_match")


def make_rule(name: str, temperature: float, seed: int) -> TargetMatch:
    """``greedy``: argmax matching (temperature must be 0); ``sample_match``: sample then match."""
    if name == "greedy":
        if temperature > 0:
            raise ConfigError("acceptance 'greedy' needs temperature 0; use 'sample_match' for sampling")
        return TargetMatch(0.0, seed)
    if name == "sample_match":
        return TargetMatch(temperature, seed)
    raise ConfigError(f"unknown acceptance rule {name!r}: choose one of {', '.join(ACCEPTANCE_RULES)}")
