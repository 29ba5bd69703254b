"""Token choice from target logits: greedy, or temperature sampling keyed by output position.

Sampling draws its uniform number from a generator seeded by (stream, output position), where a
generation's stream is :func:`generation_seed` of the run's seed and the prompt's token ids. So the
token at a given position depends only on the logits there and the prompt: a lossless speculative
route samples exactly the tokens AR samples on the same prompt with the same seed, which makes
"identical to AR" a meaningful check at any temperature, while two prompts (or a second turn after
its first, whose prompt holds the first turn's tokens) draw independent numbers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch

_POSITION_SALT = 0x9E3779B9  # keeps the position draws apart from the step streams of step_rng


def generation_seed(seed: int, prompt_ids: Sequence[int]) -> int:
    """The seed of one generation's draws: a 63-bit hash of the run's ``seed`` and the prompt's ids."""
    digest = hashlib.blake2b(repr((seed, list(prompt_ids))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def position_uniform(seed: int, position: int) -> float:
    """A reproducible U(0, 1) draw (53 bits) for one output position: a function of the whole (``seed``,
    ``position``) (numpy's seed sequence takes integers of any size; torch's CPU generator keeps a seed's
    low 32 bits only, so seeds 2**32 apart would draw alike)."""
    return float(np.random.default_rng(_words(_POSITION_SALT, seed, position)).random())


def _words(salt: int, seed: int, position: int) -> list[int]:
    """A generator's entropy as fixed-width 32-bit words (numpy's seed sequence cuts each integer into as
    many words as it needs, so (s, p) lists of varying widths could meet: [1, 256] = [2**40 + 1, 0])."""
    seed, position = seed % 2**64, position % 2**64
    return [salt, seed & 0xFFFFFFFF, seed >> 32, position & 0xFFFFFFFF, position >> 32]


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Softmax of logits / temperature in float64 (rows of [.., V])."""
    return torch.softmax(logits.double() / temperature, dim=-1)


def pick_token(logits: torch.Tensor, temperature: float, seed: int, position: int) -> int:
    """Argmax when temperature is 0, else inverse-CDF sampling with the position's draw (on the host in
    float64, so the same logits give the same token on any device)."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    cdf = torch.cumsum(target_probs(logits.detach().cpu(), temperature), dim=-1)
    u = position_uniform(seed, position) * float(cdf[-1])
    return min(int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype)).item()), cdf.numel() - 1)


_STEP_SALT = 0x5EED5  # keeps a step's stream apart from the position draws of pick_token


def step_rng(seed: int, position: int) -> np.random.Generator:
    """The reproducible random stream of one decode step, keyed by (seed, root position).

    Sampled tree builders draw their children from it first, then a sampling acceptance rule
    draws its uniforms from it: one step's draws are independent of each other, of every other
    step's and of the AR draws of :func:`position_uniform`.
    """
    return np.random.default_rng(_words(_STEP_SALT, seed, position))


def probs_row(logits: torch.Tensor, temperature: float) -> np.ndarray:
    """The target's next-token distribution (float64 numpy [V]); temperature 0 gives the argmax one-hot."""
    if temperature <= 0:
        out = np.zeros(logits.shape[-1])
        out[int(torch.argmax(logits))] = 1.0
        return out
    return target_probs(logits, temperature).cpu().numpy()


def sample_index(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from (possibly unnormalised) ``probs`` with the uniform ``u``."""
    cdf = np.cumsum(probs)
    return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), probs.size - 1)
