"""Target features of committed tokens, keyed by absolute position (shared by feature-conditioned drafters).

A drafter that reads the target's hidden states (DFlash, EAGLE) needs them for every committed
token: prefill chunks arrive through ``observe_prefill``, later tokens from the accepted path of
each step's verification. Only the accepted path's rows are real: rows of rejected draft nodes
are never stored, and a verification that starts before the end of the cache replaces the rows
from its position on.
"""

from __future__ import annotations

import torch

from repro.errors import ConfigError
from repro.models.hybrid import Verification


def ingest_start(owner: str, layers: tuple[int, ...], ver: Verification, count: int) -> int:
    """The first position ``ver``'s accepted rows go to (its position), after checking that it holds
    every layer in ``layers`` and continues the ``count`` positions a drafter holds; else one line."""
    missing = [i for i in layers if i not in ver.hidden]
    if missing:
        raise ConfigError(
            f"the target returned no hidden states for layer(s) {missing}: verify with "
            "capture=drafter.capture_layers"
        )
    if ver.position > count:
        raise ConfigError(
            f"{owner} drafter lacks target hidden states for positions {count}..{ver.position - 1}: "
            "the engine must pass every prefill chunk to observe_prefill"
        )
    return ver.position


class FeatureCache:
    """Concatenated outputs of the target layers ``layers`` per committed position, [P, len * width]."""

    def __init__(
        self, owner: str, layers: tuple[int, ...], width: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.owner = owner
        self.layers = layers
        self.width = width
        self.dtype = dtype
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.rows = torch.zeros(0, len(self.layers) * self.width, dtype=self.dtype, device=self.device)
        self._last: Verification | None = None

    @property
    def count(self) -> int:
        """Number of leading positions whose target features are cached."""
        return self.rows.shape[0]

    def ingest(self, ver: Verification, path: list[int]) -> int | None:
        """Store the features of the accepted ``path`` (root first) at positions ver.position + i.

        Returns the first position written, or None when there was nothing new (an empty path or
        a verification already ingested).
        """
        if ver is self._last or not path:
            return None
        start = ingest_start(self.owner, self.layers, ver, self.count)
        idx = torch.as_tensor(path, dtype=torch.long, device=self.device)
        new = torch.cat([ver.hidden[i].index_select(0, idx) for i in self.layers], dim=-1).to(self.dtype)
        self.rows = torch.cat([self.rows[:start], new], dim=0)
        self._last = ver
        return start

    def expect(self, committed: int) -> None:
        """Raise unless exactly ``committed`` positions are cached."""
        if self.count != committed:
            raise ConfigError(
                f"{self.owner} drafter holds hidden states of {self.count} tokens "
                f"but {committed} are committed"
            )
