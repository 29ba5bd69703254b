"""What the drafters' Triton kernels share about dtypes: a torch float dtype's Triton dtype and rounding to
it (exact in Triton's CPU interpreter too)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def round_to(x, DT: tl.constexpr):
    """x (float32 or float64) rounded to DT, round to nearest even, back in x's dtype. bfloat16 by integer
    arithmetic on the float32 bits (exact in Triton's CPU interpreter too, whose casts truncate)."""
    if DT == tl.bfloat16:  # noqa: SIM300 - constexpr dtypes
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True).to(x.dtype)
    if DT == tl.float16:  # noqa: SIM300
        return x.to(DT, fp_downcast_rounding="rtne").to(x.dtype)
    return x.to(DT).to(x.dtype)


def tl_dtype(dtype: torch.dtype) -> tl.dtype:
    """Triton's dtype for a torch float dtype (a kernel's DT constexpr)."""
    return {torch.float64: tl.float64, torch.float32: tl.float32, torch.bfloat16: tl.bfloat16,
            torch.float16: tl.float16}[dtype]  # fmt: skip
