"""What the drafters' fast forwards (:mod:`repro.drafters.eagle_fast`, :mod:`repro.drafters.dflash_fast`)
share: which linear kernel a call of ``rows`` rows takes, the rotary tables they read, and the check that a
fast path has a device to run on. Drafters do not import :mod:`repro.gdn`, so the kernels' row bounds are
copied here and pinned equal to ``repro.gdn.triton_linear``'s by the tests."""

from __future__ import annotations

import os

import torch

from repro.drafters.layers import rotary_tables
from repro.errors import ConfigError

GEMV_ROWS = 4  # repro.gdn.triton_linear.MAX_ROWS: rows of the GEMV variant
TILED_ROWS = 256  # repro.gdn.triton_linear.MAX_VERIFY_ROWS: rows of the row-tiled variant


def triton_linears(rows: int, hidden: int, row_tiled_width: int) -> bool:
    """Whether ``rows`` rows of width ``hidden`` take the Triton linears (else cuBLAS): the GEMV kernels up
    to GEMV_ROWS rows at every width, the row-tiled ones up to TILED_ROWS rows at widths up to
    ``row_tiled_width`` (they lost to cuBLAS at wider ones on the target side)."""
    return rows <= GEMV_ROWS or (rows <= TILED_ROWS and hidden <= row_tiled_width)


def rotary_rows(
    rows: int, head_dim: int, theta: float, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [rows, head_dim] of positions 0 .. rows - 1: the values ``rotary_tables`` gives."""
    cos, sin = rotary_tables(torch.arange(rows, device=device)[None], head_dim, theta, dtype)
    return cos[0, 0], sin[0, 0]


def signed_rotary(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """[rows, 2, hd]: cos and the signed sin (-sin | sin), so that ``x cos + roll(x, hd / 2) sin_signed``
    makes ``apply_rope``'s products."""
    half = cos.shape[-1] // 2
    return torch.stack([cos, torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)], dim=1).contiguous()


def check_fast_device(fast: bool, device: torch.device, what: str) -> None:
    """A one-line ConfigError when ``fast`` asks for Triton kernels with neither CUDA nor the interpreter."""
    if fast and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError(
            f"{what}: fast=True runs Triton kernels: it needs a CUDA device (or TRITON_INTERPRET=1)"
        )
