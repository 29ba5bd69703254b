"""A synthetic drafter with controlled acceptance (SpecLA's controlled acceptance study).

It knows the target's own continuation (AR's output for the same prompt, seed and
temperature) and proposes it, replacing each token with a wrong one with probability 1 - p.
For trees, each extra sibling slot independently gets the right token with probability p when
the first choice is wrong; siblings always differ. p = 1 gives full acceptance, p = 0 none.
"""

from __future__ import annotations

import hashlib
import random

from repro.drafters.base import DraftContext, Proposal
from repro.errors import ConfigError


class SyntheticDrafter:
    capture_layers: tuple[int, ...] = ()

    def __init__(self, p: float, depth: int, width: int, vocab_size: int, seed: int) -> None:
        if not 0.0 <= p <= 1.0:
            raise ConfigError(f"synthetic drafter acceptance p={p} must lie in [0, 1]")
        if depth < 1 or width < 1:
            raise ConfigError(f"synthetic drafter needs depth >= 1 and width >= 1 (got {depth}, {width})")
        if width >= vocab_size:
            raise ConfigError(f"tree width {width} must be smaller than the vocabulary ({vocab_size})")
        self.p, self.depth, self.width, self.vocab_size, self.seed = p, depth, width, vocab_size, seed
        self.reference: list[int] = []
        self.rng = random.Random(seed)

    def begin(self, prompt_ids: list[int], reference_ids: list[int] | None) -> None:
        if reference_ids is None:
            raise ConfigError("the synthetic drafter needs AR's output as its reference (run the ar route)")
        self.reference = list(reference_ids)
        digest = hashlib.sha256(f"{self.seed}:{prompt_ids}".encode()).digest()
        self.rng = random.Random(int.from_bytes(digest[:8], "little"))

    def _wrong(self, exclude: set[int]) -> int:
        while True:
            tok = self.rng.randrange(self.vocab_size)
            if tok not in exclude:
                return tok

    def propose(self, ctx: DraftContext) -> Proposal:
        candidates: list[list[int]] = []
        for d in range(self.depth):
            pos = ctx.next_position + d
            right = self.reference[pos] if pos < len(self.reference) else None
            level: list[int] = []
            hit = False
            for _ in range(self.width):
                if right is not None and not hit and self.rng.random() < self.p:
                    level.append(right)
                    hit = True
                else:
                    level.append(self._wrong(set(level) | ({right} if right is not None else set())))
            candidates.append(level)
        return Proposal(candidates)
