"""Helpers shared by the Triton kernels of :mod:`repro.gdn`: arithmetic dtype, power-of-two tiles,
rounding and SiLU device functions, and the CPU interpreter's compatibility patch (applied on import,
once, only in interpreter mode)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    """Triton's CPU interpreter is on (TRITON_INTERPRET=1): the kernels then run on CPU tensors."""
    return bool(triton.knobs.runtime.interpret)


def acc_dtype(dtype: torch.dtype) -> tl.dtype:
    """Arithmetic dtype of the kernels: float64 for float64 data, else float32."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def pow2(x: int) -> int:
    """The smallest power of two >= x."""
    return triton.next_power_of_2(int(x))


@triton.jit
def round_to(x, ptr):
    """x in the element type of ``ptr`` (round to nearest even when narrowing floats)."""
    if ptr.dtype.element_ty == tl.float32 or ptr.dtype.element_ty == tl.float64:
        return x.to(ptr.dtype.element_ty)
    return x.to(ptr.dtype.element_ty, fp_downcast_rounding="rtne")


@triton.jit
def silu(x):
    return x / (1.0 + tl.exp(-x))


def _interpreter_numpy_compat() -> None:
    """Let Triton's CPU interpreter (TRITON_INTERPRET=1) run loops with run-time bounds on NumPy >= 2.4.

    The interpreter holds scalar kernel arguments as 1-element 1-D arrays and converts them with
    ``int(array)``, which NumPy 2.4 rejects ("only 0-dimensional arrays can be converted"), so
    ``for i in range(0, n)`` fails. Patch its tensor ``__index__`` to take the single element. Only in
    interpreter mode; compiled kernels are untouched.
    """
    try:
        import numpy as np

        int(np.ones(1, dtype=np.int32))
        return
    except TypeError:
        pass
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_repro_patched", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._repro_patched = True
    interpreter._patch_lang_tensor = patched


if triton.knobs.runtime.interpret:
    _interpreter_numpy_compat()
