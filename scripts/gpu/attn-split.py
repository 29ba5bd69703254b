"""Issue 13 (and 10's drafters at long context): attention_tree with its cache rows split (flash-decoding).

    python3 scripts/gpu/attn-split.py OUT_DIR      (one H200: < 90 s)

:func:`repro.gdn.triton_attention.attention_tree` (bf16, random q|k|v rows and cache) at Qwen3.6-27B's
attention shape (24 query heads over 4 key heads, hd 256, rotary 64, output gate) and tiny-qwen35's (4 over
2, hd 48, rotary 12, gate), for n = 1 (a decode step: ``tree_attention_decode``), 16 (a DFlash block: every
node sees the block) and 65 (a draft tree's verify), at cache lengths 512, 2048 and 8192 in a buffer of
8192 + 128 rows (so the default S is the same at every length): the kernel alone, CUDA-graph medians
(:func:`repro.bench.timing.graph_us`) at S = 1 (the unsplit kernel, one launch), the default S
(:func:`~repro.gdn.triton_attention.tree_splits`) and a sweep S in {2, 4, 8, 16, 32} (decode: all of
them; n = 16: 2, 4, 8; n = 65: 2), each output first checked against S = 1's (bf16 relative error, and
the nodes' keys bitwise). Rows are done 27B first, decode first; those not started within the time
budget are skipped (S is a run-time argument: one compile of the split kernel per shape and n, and
one of the combine per power of two above S).

Writes OUT_DIR/attn-split.json and OUT_DIR/attn-split.md; prints the markdown. Without CUDA (with
TRITON_INTERPRET=1) a small smoke run of the same code: the tiny shape, cache 40 rows, no graphs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.shapes import make_tree  # noqa: E402
from repro.bench.timing import TimerConfig, graph_us, median_us  # noqa: E402
from repro.gdn.triton_attention import attention_tree, rotary_table, tree_blocks  # noqa: E402
from repro.gdn.triton_common import sm_count  # noqa: E402
from repro.tree import ancestor_matrix  # noqa: E402

GPU = torch.cuda.is_available()
DEV = torch.device("cuda" if GPU else "cpu")
# name: (H, H_kv, head_dim, rotary channels)
SHAPES = {"qwen3.6-27b": (24, 4, 256, 64), "tiny-qwen35": (4, 2, 48, 12)}
LENGTHS = (512, 2048, 8192) if GPU else (40,)
ROWS = (8192 if GPU else 40) + 128  # the cache buffer's capacity
SWEEP = {1: (2, 4, 8, 16, 32), 16: (2, 4, 8), 65: (2,)} if GPU else {1: (2, 3), 16: (2,)}
if not GPU:
    SHAPES = {"tiny-qwen35": SHAPES["tiny-qwen35"]}
CFG = TimerConfig(warmup_ms=2.0, rep_ms=8.0, graph_replays=5)
START = time.perf_counter()
BUDGET_S = 70.0  # rows and split counts not started by then are skipped


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return (
        float((a - b).norm() / b.norm().clamp_min(1e-300)) if bool(torch.isfinite(a).all()) else float("inf")
    )


def time_us(fn, estimate_us: float) -> float:  # noqa: ANN001
    """Median us per call: CUDA-graph replays on the GPU, a synchronised loop elsewhere (smoke only)."""
    return graph_us([fn], DEV, CFG, estimate_us) if GPU else median_us(fn, DEV, TimerConfig(0.0, 1.0))


class Case:
    """attention_tree's inputs at one shape, node count and cache length (bf16, on the device)."""

    def __init__(self, shape: tuple[int, int, int, int], n: int, length: int, seed: int) -> None:
        h, hkv, hd, rot = shape
        gen = torch.Generator(device=DEV).manual_seed(seed)
        dt = torch.bfloat16

        def randn(*size: int) -> torch.Tensor:
            return torch.randn(*size, generator=gen, device=DEV).to(dt)

        self.heads = h
        self.qkv = randn(n, 2 * h * hd + 2 * hkv * hd)
        self.scales = (1 + 0.1 * randn(hd), 1 + 0.1 * randn(hd))
        self.keys, self.values = randn(hkv, ROWS, hd), randn(hkv, ROWS, hd)
        inv_freq = 1e7 ** (-torch.arange(0, rot, 2, dtype=torch.float64) / rot)
        self.rope = rotary_table(inv_freq, ROWS + n, dt, DEV)
        self.length = torch.tensor([length], device=DEV)
        if n == 16:  # a DFlash block: every node sees the whole block, depths 1 .. n
            anc, depth = np.ones((n, n), dtype=np.bool_), np.arange(1, n + 1)
        else:
            anc, depth = ancestor_matrix(np.array(make_tree("draft", n, seed=n), dtype=np.int64))
        self.anc = torch.from_numpy(anc).to(DEV)
        self.depth = torch.from_numpy(np.asarray(depth, dtype=np.int64)).to(DEV)

    def __call__(self, splits: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        out, k, _ = attention_tree(
            self.qkv, *self.scales, (1e-6, 1e-6), self.rope, self.keys, self.values, self.length,
            self.depth, self.anc, self.heads, True, splits=splits,
        )  # fmt: skip
        return out, k


def default_splits(shape: tuple[int, int, int, int], n: int) -> int:
    """The S attention_tree picks for bf16 at this shape, node count and buffer on this device."""
    h, hkv, hd, _ = shape
    return tree_blocks(torch.bfloat16, DEV, n, h, hkv, hd, ROWS)[2]


def rows_for(name: str, shape: tuple[int, int, int, int], n: int) -> list[dict[str, Any]]:
    rows = []
    default = default_splits(shape, n)
    counts = [1] + sorted({default, *SWEEP[n]} - {1})
    for length in LENGTHS:
        row: dict[str, Any] = dict(shape=name, n=n, length=length, default_splits=default, us={}, err={})
        if time.perf_counter() - START > BUDGET_S:
            rows.append({**row, "skipped": "time budget"})
            continue
        case = Case(shape, n, length, seed=length + n)
        ref_out, ref_k = case(1)
        row["k_differs"] = []
        for s in counts:
            if time.perf_counter() - START > BUDGET_S:  # neither compiled nor timed
                row["us"][s] = None
                continue
            out, k = case(s)
            row["err"][s] = rel(out, ref_out)
            row["k_differs"] += [s] if not torch.equal(k, ref_k) else []
            row["us"][s] = time_us(lambda c=case, s=s: c(s), 10.0)
        timed = [(us, s) for s, us in row["us"].items() if us is not None]
        row["best"] = {"splits": min(timed)[1], "us": min(timed)[0]} if timed else None
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def markdown(res: dict[str, Any]) -> str:
    lines = [
        f"# attn-split: attention_tree's cache rows split over S programs ({res['device']}, bf16)",
        "",
        f"Kernel alone (us, CUDA-graph medians); cache buffer {ROWS} rows; 'err': the worst relative error",
        "of any S against S = 1 (bf16); 'k': the nodes' keys bitwise equal for every S.",
        "",
        "| shape | n | length | S = 1 | default S | default us | S = 1 / default | best S (us) "
        "| sweep (S: us) | err | k |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        head = f"| {r['shape']} | {r['n']} | {r['length']} "
        if "skipped" in r:
            lines.append(head + f"| skipped ({r['skipped']}) |")
            continue
        us, d = r["us"], r["default_splits"]

        def fmt(x: float | None) -> str:
            return "-" if x is None else f"{x:.1f}"

        ratio = f"{us[1] / us[d]:.2f}x" if us.get(1) and us.get(d) else "-"
        sweep = ", ".join(f"{s}: {fmt(v)}" for s, v in us.items() if s != 1)
        best = f"{r['best']['splits']} ({r['best']['us']:.1f})" if r["best"] else "-"
        lines.append(
            head + f"| {fmt(us.get(1))} | {d} | {fmt(us.get(d))} | {ratio} | {best} | {sweep} | "
            f"{max(r['err'].values(), default=0.0):.1e} | "
            f"{'ok' if not r['k_differs'] else 'DIFFER ' + str(r['k_differs'])} |"
        )
    lines += ["", f"total {res['seconds']:.0f} s"]
    return "\n".join(lines) + "\n"


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if GPU else "cpu (interpreter smoke run)",
        "sms": sm_count(DEV),
        "rows_capacity": ROWS,
        "rows": [],
    }
    with torch.no_grad():
        for n in SWEEP:  # decode first, 27B first
            for name, shape in SHAPES.items():
                res["rows"] += rows_for(name, shape, n)
    res["seconds"] = time.perf_counter() - START
    (out / "attn-split.json").write_text(json.dumps(res, indent=1))
    md = markdown(res)
    (out / "attn-split.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
