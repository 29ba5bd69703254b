"""The drafter interface and the proposal it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from repro.models.hybrid import Verification
from repro.tree import Tree


@dataclass
class DraftContext:
    """What a drafter may look at before one decode step.

    ``output_ids`` are the tokens generated so far; the last one is the pending root of the
    next tree. ``verification`` and ``accepted_path`` describe the previous step (hidden states
    of the layers the drafter asked for are in ``verification.hidden``).
    """

    prompt_ids: list[int]
    output_ids: list[int]
    verification: Verification | None = None
    accepted_path: list[int] = field(default_factory=list)

    @property
    def next_position(self) -> int:
        """Output index of the token that follows the pending root."""
        return len(self.output_ids)


@dataclass
class Proposal:
    """Ranked candidate tokens per draft depth (depth 1 first), optionally with probabilities.

    ``candidates[d][0]`` is the drafter's first choice at depth d+1; deeper candidates are
    conditioned on the first choices above them. Drafters that grow their own tree while
    drafting (Weaver, EAGLE-style dynamic trees) put it in ``tree`` (root = the pending token);
    the ``DrafterTree`` builder passes it through.
    """

    candidates: list[list[int]]
    probs: torch.Tensor | None = None  # [depth, V] marginals when the drafter has them
    tree: Tree | None = None

    @property
    def depth(self) -> int:
        return len(self.candidates)


class Drafter(Protocol):
    """Proposes continuations; ``capture_layers`` are target layers whose hidden states it reads."""

    capture_layers: tuple[int, ...]

    def begin(self, prompt_ids: list[int], reference_ids: list[int] | None) -> None:
        """Start a new generation (``reference_ids``: AR's output, for synthetic drafters)."""
        ...

    def propose(self, ctx: DraftContext) -> Proposal: ...
