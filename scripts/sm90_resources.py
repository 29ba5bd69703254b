"""Registers and spills of the tree kernels' launches, on the CPU: each form is called at a shape with its
launches intercepted, each launch compiled for sm_90 as Triton would specialise it there (pointers
aligned to and integers divisible by 16 marked so, 1 as a constant), and the wheel's ptxas -v reports the
registers a thread and the spill bytes. No GPU: a spilling variant shows before a device call
(results/2026-12-06-h100-peel-root: 255 registers and spills at 129 nodes, found on the device).

    python scripts/sm90_resources.py weaver:129:split_peel specla:65:split tiny-qwen35:33:fused

Each argument is SHAPE:NODES:FORM[:KNOB=VALUE,...] (shapes of repro.bench.shapes, forms fused / split /
split_peel, knobs the form's integer or string tuning arguments, e.g. ``weaver:256:split:block_v=16``); the
tree is a chain's mask given as a tree (the kernels read the mask either way). Prints a markdown table.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from repro.bench.shapes import SHAPES
from repro.gdn import triton_tree as tt

KERNELS = ("_tree_verify_kernel", "_tree_keys_kernel", "_tree_values_kernel")
FORMS = ("fused", "split", "split_peel")
SHOWN = ("BR", "BV", "NPG", "STRICT", "PEEL", "NR", "REGS", "TERMS")
TYPES = {
    torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64",
    torch.int64: "i64", torch.int32: "i32", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1",
}  # fmt: skip


class _Intercept:
    """Stands in for a JIT kernel: ``kernel[grid](*args, **kwargs)`` records the call instead of launching."""

    def __init__(self, fn: Any, calls: list) -> None:
        self.fn, self.calls = fn, calls

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.calls.append((self.fn, args, kwargs))


def _signature(fn: Any, args: tuple, kwargs: dict) -> tuple[dict, dict, dict, dict]:
    """(signature, constexprs, attrs, options) of one recorded launch, specialised as at a launch."""
    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if kwargs.get(k) is not None}
    values = {**dict(zip(fn.arg_names, args)), **kwargs}
    sig, consts, attrs = {}, {}, {}
    for i, (name, param) in enumerate(zip(fn.arg_names, fn.params)):
        v = values.get(name, param.default)
        if param.is_constexpr or v is None or (isinstance(v, int) and not isinstance(v, bool) and v == 1):
            sig[name], consts[name] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[name] = "*" + TYPES[v.dtype]
            if v.data_ptr() % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[name] = "i1"
        elif isinstance(v, int):
            sig[name] = "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{name}: cannot type {type(v).__name__}")
    return sig, consts, attrs, options


def resources(fn: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Registers a thread and spill bytes of one recorded launch, compiled for sm_90a."""
    sig, consts, attrs, options = _signature(fn, args, kwargs)
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        cmd = [get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(path), "-o", str(Path(tmp) / "k.cubin")]
        report = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    stores, loads = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)[-1]
    return {"kernel": fn.__name__, "regs": int(re.findall(r"Used (\d+) registers", report)[-1]),
            "spill_stores": int(stores), "spill_loads": int(loads),
            **{k: consts[k] for k in SHOWN if k in consts}}  # fmt: skip


def launches(shape: str, n: int, form: str, **knobs: Any) -> list[tuple[Any, tuple, dict]]:
    """The kernel launches of one call of the tree form at the shape (bf16, "tf32", ``knobs``), recorded."""
    s = SHAPES[shape]
    q, k = (torch.randn(n, s.h, s.dk, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(n, s.hv, s.dv, dtype=torch.bfloat16)
    g, beta, state = -torch.rand(n, s.hv), torch.rand(n, s.hv), torch.zeros(s.hv, s.dv, s.dk)
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
    calls: list = []
    saved = {name: getattr(tt, name) for name in KERNELS}
    for name, fn in saved.items():
        setattr(tt, name, _Intercept(fn, calls))
    try:
        if form == "fused":
            tt.tree_gdn_fused(q, k, v, g, beta, state, mask, s.scale, "tf32", **knobs)
        else:
            tt.tree_gdn_split(
                q, k, v, g, beta, state, mask, s.scale, "tf32", peel=form == "split_peel", **knobs
            )
    finally:
        for name, fn in saved.items():
            setattr(tt, name, fn)
    return calls


def parse(spec: str) -> tuple[str, int, str, dict[str, Any]]:
    """SHAPE:NODES:FORM[:KNOB=VALUE,...] as (shape, nodes, form, knobs), or ValueError with the reason."""
    parts = spec.split(":")
    (shape, n, form), rest = (parts + ["", "", ""])[:3], parts[3:]
    if shape not in SHAPES or form not in FORMS or not n.isdigit() or int(n) < 1 or len(rest) > 1:
        raise ValueError(f"{spec!r}: expected SHAPE:NODES:FORM[:KNOB=VALUE,...] with SHAPE one of "
                         f"{', '.join(SHAPES)} and FORM one of {', '.join(FORMS)}")  # fmt: skip
    pairs = [kv.split("=", 1) for kv in rest[0].split(",")] if rest else []
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"{spec!r}: knobs must be KNOB=VALUE, comma-separated")
    return shape, int(n), form, {k: int(v) if v.isdigit() else v for k, v in pairs}


def main(specs: list[str]) -> int:
    if not specs:
        print(__doc__)
        return 2
    try:
        parsed = [parse(spec) for spec in specs]
    except ValueError as err:
        print(f"sm90_resources: {err}", file=sys.stderr)
        return 2
    print("| shape | nodes | form | kernel | regs | spill stores | spill loads | constexprs |")
    print("|---|--:|---|---|--:|--:|--:|---|")
    for spec, (shape, n, form, knobs) in zip(specs, parsed):
        for fn, args, kwargs in launches(shape, n, form, **knobs):
            r = resources(fn, args, dict(kwargs))
            shown = ", ".join(f"{k}={r[k]}" for k in SHOWN if k in r)
            name = spec.split(":", 2)[2]
            print(f"| {shape} | {n} | {name} | {r['kernel']} | {r['regs']} | {r['spill_stores']} | "
                  f"{r['spill_loads']} | {shown} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
