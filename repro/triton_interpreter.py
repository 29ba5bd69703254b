"""Repro's patches to Triton's CPU interpreter (TRITON_INTERPRET=1), applied once when this module is
imported in interpreter mode (``repro/__init__.py`` imports it then, before any kernel runs); compiled
kernels are untouched, and so is every interpreted kernel's result.

- :func:`numpy_compat`: loops with run-time bounds on NumPy >= 2.4;
- :func:`patch_once`: ``triton.language`` patched once per launch, not again at every device-function call
  (a third of the interpreter's time in kernels that call helpers in loops);
- :func:`no_dead_overflow_checks`: no integer-overflow checks whose assert the interpreter drops anyway;
- :func:`vectorized_xor_sum`: ``tl.xor_sum`` (in every step of ``tl.sort`` / ``tl.topk``) reduced by NumPy.

The CPU test suite runs every Triton kernel through the interpreter: the second and third took 40% off
its interpreter runs (the Weaver growth's 108 -> 63 s, the slot kernels' 75 -> 43 s, 2 cores), the last
most of the top-k kernels'.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import triton
import triton.language as tl
from triton.runtime import interpreter


def numpy_compat() -> None:
    """Let Triton's CPU interpreter (TRITON_INTERPRET=1) run loops with run-time bounds on NumPy >= 2.4.

    The interpreter holds scalar kernel arguments as 1-element 1-D arrays and converts them with
    ``int(array)``, which NumPy 2.4 rejects ("only 0-dimensional arrays can be converted"), so
    ``for i in range(0, n)`` fails. Patch its tensor ``__index__`` to take the single element. Only in
    interpreter mode; compiled kernels are untouched.
    """
    try:
        int(np.ones(1, dtype=np.int32))
        return
    except TypeError:
        pass
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_repro_patched", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._repro_patched = True
    interpreter._patch_lang_tensor = patched


def patch_once() -> None:
    """Patch ``triton.language`` once per launch instead of once per device-function call.

    Triton 3.6's interpreter patches the language modules a ``@triton.jit`` device function sees again
    at every call of it inside a kernel (``InterpretedFunction.__call__`` -> ``_patch_lang``:
    ``inspect.getmembers`` over ``tl``, ``tl.tensor`` and ``tl.math``): 6.2 of 19.2 s in a Weaver growth,
    whose kernel calls helpers in loops. That repeat changes nothing: the launch (``GridExecutor.__call__``)
    patched those modules already and restores them when it ends, and the builtins it replaced are no
    longer builtins, so a repeat only sets the same attributes again. A device call whose modules the
    running launch has patched skips it; one that sees a module the launch did not is patched as before.
    ``_patch_lang.original``: Triton's."""
    original = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if original is None or executor is None or getattr(original, "_repro_patched", False):
        return
    launches: list[set[int]] = []  # per running launch: ids of the language modules it has patched

    class Unpatched:
        def restore(self) -> None:
            pass

    def patch_lang(fn):  # noqa: ANN001, ANN202 - the interpreter's signature
        langs = {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}
        if launches and langs and langs <= launches[-1]:
            return Unpatched()
        scope = original(fn)
        if launches:
            launches[-1] |= langs
        return scope

    run = executor.__call__

    def call(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        launches.append(set())
        try:
            return run(self, *args, **kwargs)
        finally:
            launches.pop()

    patch_lang._repro_patched = True
    patch_lang.original = original
    interpreter._patch_lang = patch_lang
    executor.__call__ = call


def no_dead_overflow_checks() -> None:
    """Turn off the interpreter's integer-overflow sanitizer while its ``debug`` option is off.

    With ``sanitize_overflow`` (on by default) every int32 add / sub / mul of an interpreted kernel also
    computes the operation in int64 and compares it with the type's bounds, then hands the result to
    ``device_assert``, which returns at once unless ``debug`` is on (off by default: no assert is made). That
    dead check took 65 of 176 s of a slot-kernel test's interpreter time. Results are unchanged; with
    ``debug`` on, the checks stay. Only in interpreter mode."""
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or options.debug or not getattr(options, "sanitize_overflow", False):
        return
    builder.options = dataclasses.replace(options, sanitize_overflow=False)


def vectorized_xor_sum() -> None:
    """Reduce ``tl.xor_sum`` with NumPy's ``bitwise_xor.reduce`` instead of element by element.

    The interpreter reduces with a combine function it does not know (``sum``, ``max``, ``min`` and the
    argmax / argmin ones it does) by calling it in Python once per element; ``tl.sort`` and ``tl.topk`` run
    ``xor_sum`` in every compare-and-swap of their bitonic network, which made 84 of 97 s of a top-k
    test's interpreter time. The XOR of integers is exact in any order, so the result is the same."""
    ops = getattr(interpreter, "ReduceOps", None)
    combine = getattr(tl.standard, "_xor_combine", None)
    if ops is None or combine is None or getattr(ops.apply_impl, "_repro_patched", False):
        return
    apply_impl = ops.apply_impl

    def patched(self, input):  # noqa: ANN001, ANN202 - the interpreter's signature
        if self.combine_fn is combine and len(input) == 1:
            data = np.bitwise_xor.reduce(input[0].handle.data, axis=self.axis, keepdims=self.keep_dims)
            return self.to_tensor(data, input[0].dtype)
        return apply_impl(self, input)

    patched._repro_patched = True
    patched.original = apply_impl
    ops.apply_impl = patched


if triton.knobs.runtime.interpret:
    numpy_compat()
    patch_once()
    no_dead_overflow_checks()
    vectorized_xor_sum()
