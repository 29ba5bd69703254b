"""The drafter interface and the proposal it returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from repro.models.hybrid import Verification
from repro.tree import DeviceTree, Tree

if TYPE_CHECKING:
    from repro.models.graphed import LaunchedStep


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


class Proposal:
    """Ranked candidate tokens per draft depth (depth 1 first), optionally with probabilities.

    ``candidates[d][0]`` is the drafter's first choice at depth d+1; deeper candidates are
    conditioned on the first choices above them. A drafter on the device may give ``top_ids``
    ([depth, k] on the device) or a ``read`` function instead: ``candidates`` then reads them on first
    use (a sync that device-side tree builders never make). Drafters that grow their own tree while
    drafting (Weaver, EAGLE-style dynamic trees) put it in ``tree`` (root = the pending token; a
    :class:`Tree`, or a :class:`DeviceTree` grown on the device, with ``read`` giving its greedy path);
    the ``DrafterTree`` builder passes it through.
    """

    def __init__(
        self,
        candidates: list[list[int]] | None = None,
        probs: torch.Tensor | None = None,
        tree: Tree | DeviceTree | None = None,
        top_ids: torch.Tensor | None = None,
        read: Callable[[], list[list[int]]] | None = None,
    ) -> None:
        if candidates is None and top_ids is None and read is None:
            raise ValueError("a proposal needs candidates, top_ids or a reader")
        self._candidates = candidates
        self.probs = probs  # [depth, V] marginals when the drafter has them
        self.tree = tree
        self.top_ids = top_ids
        self._read = read

    @property
    def candidates(self) -> list[list[int]]:
        if self._candidates is None:
            if self._read is not None:
                self._candidates = self._read()
            else:
                assert self.top_ids is not None
                self._candidates = self.top_ids.tolist()
        return self._candidates

    @property
    def depth(self) -> int:
        if self._candidates is None and self._read is None and self.top_ids is not None:
            return int(self.top_ids.shape[0])
        return len(self.candidates)


class Drafter(Protocol):
    """Proposes continuations; ``capture_layers`` are target layers whose hidden states it reads."""

    capture_layers: tuple[int, ...]

    def begin(self, prompt_ids: list[int], reference_ids: list[int] | None) -> None:
        """Start a new generation (``reference_ids``: AR's output, for synthetic drafters)."""
        ...

    def propose(self, ctx: DraftContext) -> Proposal: ...


class PipelinedDrafter(Drafter, Protocol):
    """A drafter that can draft after a greedy step launched on a graphed target and not yet read (the
    engine's pipelined loop, :func:`repro.decoding.engine.pipelined`)."""

    def pipelines(self) -> bool:
        """Whether it can now (e.g. its static buffers are on)."""
        ...

    def propose_after(self, step: LaunchedStep) -> Proposal:
        """The proposal after ``step``: its accepted path and bonus read on the device."""
        ...

    def settle(self, accepted: int) -> None:
        """The host has read the length of the path the last ``propose_after`` ingested."""
        ...
