"""What the tree kernels compiled to, for the device scripts beside this one (``from _triton_resources import
tree_resources``): registers, spills and shared memory of every compiled variant, with the constexprs that
tell the variants apart. A spilling variant is where a kernel's time went at 64-row blocks before
(results/2026-12-06-h100-peel-root: 255 registers, 380 spills). Not a benchmark itself: scripts/gpu_session.sh
skips the names starting with ``_``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from repro.gdn import triton_tree as tt

KEEP = ("BR", "BK", "DK", "DV", "BV", "PEEL", "NPG", "STRICT", "NR", "REGS", "TERMS", "PENDING")


def compiled_resources(fn: Any) -> list[dict[str, Any]]:
    """Every variant of the Triton kernel ``fn`` compiled (or read from the cache) in this process."""
    out = []
    for kernel_cache, *_ in fn.device_caches.values():
        for kernel in kernel_cache.values():
            kernel._init_handles()
            const = {fn.arg_names[k[0]]: v for k, v in kernel.src.constants.items() if len(k) == 1}
            out.append({"kernel": kernel.name, **{k: const[k] for k in KEEP if k in const},
                        "num_warps": kernel.metadata.num_warps, "n_regs": kernel.n_regs,
                        "n_spills": kernel.n_spills, "shared": kernel.metadata.shared})  # fmt: skip
    return out


def tree_resources(out_dir: Path) -> list[dict[str, Any]]:
    """The tree kernels' compiled variants (fused, phase 1, phase 2) into OUT_DIR/tree-resources.json;
    printed a line each."""
    rows = [r for fn in (tt._tree_verify_kernel, tt._tree_keys_kernel, tt._tree_values_kernel)
            for r in compiled_resources(fn)]  # fmt: skip
    (out_dir / "tree-resources.json").write_text(json.dumps(rows, indent=1))
    for r in rows:
        print(r)
    return rows
