"""repro.triton_interpreter: the patches to Triton's CPU interpreter leave every result as it was.

One subprocess under the interpreter (TRITON_INTERPRET=1, this file as a script): the patches are on after
``import repro``; a kernel that calls a device helper in a loop gives torch's integers; a launch patches
the language modules as often whether or not its kernel calls helpers (Triton's own ``_patch_lang`` back:
more often, the negative control) and leaves them unpatched after it; the overflow checks stay on when
the interpreter's ``debug`` option is on; ``tl.xor_sum`` (by rows and whole) and ``tl.sort`` give
Triton's own element-by-element reduction's integers and torch's.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import sys

import pytest
from conftest import run_in_interpreter

triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def plus(x, i):
    return x * 3 + i


@triton.jit
def helper_kernel(x_ptr, out_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    x = tl.load(x_ptr + o)
    for i in tl.static_range(6):
        x = plus(x, i)
    tl.store(out_ptr + o, x)


@triton.jit
def xor_sort_kernel(x_ptr, rows_ptr, all_ptr, sorted_ptr, N: tl.constexpr, M: tl.constexpr):
    o = tl.arange(0, N)[:, None] * M + tl.arange(0, M)[None, :]
    x = tl.load(x_ptr + o)
    tl.store(rows_ptr + tl.arange(0, N), tl.xor_sum(x, axis=1))
    tl.store(all_ptr, tl.xor_sum(tl.reshape(x, [N * M]), axis=0))
    tl.store(sorted_ptr + o, tl.sort(x, dim=1))


@triton.jit
def plain_kernel(x_ptr, out_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(out_ptr + o, tl.load(x_ptr + o) * 3)


def _interpreter_main() -> None:
    import torch
    from triton.runtime import interpreter

    import repro  # noqa: F401 - applies the patches (TRITON_INTERPRET=1)
    from repro import triton_interpreter

    x = torch.arange(8, dtype=torch.int32)
    want = x.clone()
    for i in range(6):
        want = want * 3 + i
    counted = [0]
    builtin = interpreter._patch_builtin

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        counted[0] += 1
        return builtin(*args, **kwargs)

    interpreter._patch_builtin = counting

    def patches(kernel) -> tuple[int, list[int]]:  # noqa: ANN001
        out = torch.zeros_like(x)
        counted[0] = 0
        kernel[(1,)](x, out, N=8)
        return counted[0], out.tolist()

    helper, got = patches(helper_kernel)
    plain, _ = patches(plain_kernel)
    patched = interpreter._patch_lang
    interpreter._patch_lang = patched.original
    try:
        unpatched, got_unpatched = patches(helper_kernel)
    finally:
        interpreter._patch_lang = patched
    y = torch.randint(-(2**30), 2**30, (4, 16), generator=torch.Generator().manual_seed(0), dtype=torch.int32)

    def xor_sort() -> list[list[int]]:
        rows, whole, ordered = torch.zeros(4, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), y.clone()
        xor_sort_kernel[(1,)](y, rows, whole, ordered, N=4, M=16)
        return [rows.tolist(), whole.tolist(), ordered.flatten().tolist()]

    xor_patched = xor_sort()
    reduce = interpreter.ReduceOps.apply_impl
    interpreter.ReduceOps.apply_impl = reduce.original  # Triton's element-by-element reduction
    try:
        xor_triton = xor_sort()
    finally:
        interpreter.ReduceOps.apply_impl = reduce
    rows_want = [functools.reduce(operator.xor, r) for r in y.tolist()]
    ordered = y.sort(dim=1).values.flatten().tolist()
    xor_want = [rows_want, [functools.reduce(operator.xor, rows_want)], ordered]
    builder = interpreter.interpreter_builder
    kept = builder.options
    builder.options = dataclasses.replace(kept, debug=True, sanitize_overflow=True)
    triton_interpreter.no_dead_overflow_checks()
    debug_keeps = builder.options.sanitize_overflow
    builder.options = kept
    out = {
        "patched": bool(getattr(patched, "_repro_patched", False)),
        "sanitize_overflow": kept.sanitize_overflow,
        "debug": kept.debug,
        "helper": [helper, got],
        "plain": plain,
        "unpatched": [unpatched, got_unpatched],
        "want": want.tolist(),
        "builtin_after": tl.core.is_builtin(tl.arange) and tl.core.is_builtin(tl.core.tensor.__add__),
        "debug_keeps_checks": debug_keeps,
        "xor_sort": [xor_patched, xor_triton, xor_want],
        "xor_patched": bool(getattr(reduce, "_repro_patched", False)),
    }
    print(json.dumps(out))


@pytest.fixture(scope="module")
def interp() -> dict:
    return run_in_interpreter(__file__)


def test_the_patches_are_on_under_the_interpreter(interp: dict) -> None:
    assert interp["patched"] and not interp["debug"] and not interp["sanitize_overflow"]


def test_a_kernel_calling_helpers_gives_the_same_integers(interp: dict) -> None:
    assert interp["helper"][1] == interp["unpatched"][1] == interp["want"]


def test_a_launch_patches_the_language_once_whatever_its_helper_calls(interp: dict) -> None:
    helper, plain, unpatched = interp["helper"][0], interp["plain"], interp["unpatched"][0]
    assert helper == plain > 0
    assert unpatched > helper  # Triton's own _patch_lang patches again at each of the six helper calls
    assert interp["builtin_after"]  # the launch restored the language modules when it ended


def test_overflow_checks_stay_with_the_debug_option(interp: dict) -> None:
    assert interp["debug_keeps_checks"]


def test_xor_sums_and_sorts_are_triton_s_and_torch_s(interp: dict) -> None:
    patched, triton_own, want = interp["xor_sort"]
    assert interp["xor_patched"] and patched == triton_own == want


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
