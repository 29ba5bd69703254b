"""The row top-k kernels (repro/models/topk_kernels.py) against torch.topk at the GPU path's shapes, H200.

    python3 scripts/gpu/topk-bench.py OUT_DIR      (one H200: < 40 s)

Shapes (rows x vocabulary, k, dtype, log): DDTree's tree stage (15 x 4096, k 32, float32 marginals, float64
logs), the DFlash drafter's top ids (15 x 4096, k 1), SpecLA's EAGLE levels (1 and 16 rows x 4096, k 4),
DFlash-TfM's pool (15 x 4096 bf16 logits, k 512), and the real vocabularies (GDN-1.3B's 32000 and
Qwen3.6-27B's 248320, bf16, k 32 / 512: two launches). Each is timed as a CUDA graph of one call
(``repro.bench.timing.graph_us``, median us per call): ``torch.topk`` (``topk_kernels.KERNELS`` off) and
the kernels at each (CHUNK, WARPS) of TILES, each checked against a stable descending sort (value, then
smaller index) on the device first. Writes OUT_DIR/topk-bench.json and OUT_DIR/topk-bench.md; prints the
markdown. Exit 3 on a mismatch.

TOPK_BENCH_ONLY (comma-separated shape names) times only those shapes; TOPK_BENCH_MAX_K raises
``topk_kernels.MAX_K`` (e.g. 512: the kernels on DFlash-TfM's pool, which the default limit keeps on torch).
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.timing import TimerConfig, graph_us  # noqa: E402
from repro.models import topk_kernels  # noqa: E402

DEV = torch.device("cuda")
TIMER = TimerConfig(warmup_ms=2.0, rep_ms=10.0, graph_replays=5)
SHAPES = [  # name, rows, vocab, k, dtype, log
    ("DDTree tree stage", 15, 4096, 32, torch.float32, True),
    ("DDTree b64", 15, 4096, 64, torch.float32, True),
    ("DDTree b128", 15, 4096, 128, torch.float32, True),
    ("DFlash top ids", 15, 4096, 1, torch.float32, False),
    ("EAGLE level, 1 row", 1, 4096, 4, torch.float32, False),
    ("EAGLE level, 16 rows", 16, 4096, 4, torch.float32, False),
    ("TfM pool", 15, 4096, 512, torch.bfloat16, False),
    ("1.3B vocab, k 32", 15, 32000, 32, torch.bfloat16, False),
    ("27B vocab, k 32", 15, 248320, 32, torch.bfloat16, False),
    ("27B pool, k 512", 15, 248320, 512, torch.bfloat16, False),
]
DEFAULT_TILE = (topk_kernels.CHUNK, topk_kernels.WARPS)
TILES = [(4096, 4), (1024, 4), (512, 4)]  # chunk, warps (callCC also had 4096/8 2048/4 1024/2 512/2 256/2)


def reference(x: torch.Tensor, k: int, log: bool) -> tuple[torch.Tensor, torch.Tensor]:
    values, index = torch.sort(x.float(), dim=-1, descending=True, stable=True)
    values, index = values[..., :k].to(x.dtype), index[..., :k]
    if log:
        values = values.double().clamp(torch.finfo(torch.float64).tiny, 1.0).log()
    return values, index


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    rows, bad = [], []
    only = [s for s in os.environ.get("TOPK_BENCH_ONLY", "").split(",") if s]
    topk_kernels.MAX_K = int(os.environ.get("TOPK_BENCH_MAX_K", topk_kernels.MAX_K))
    for name, r, v, k, dtype, log in SHAPES:
        if only and name not in only:
            continue
        x = torch.randn(r, v, generator=gen).to(dtype).to(DEV)
        if log:
            x = torch.softmax(x.float() * 3, -1)
        applies = topk_kernels.triton_topk_applies(x, k)
        want = reference(x, k, log)
        call = partial(topk_kernels.row_topk, x, k, log)
        topk_kernels.KERNELS = False
        torch_us = graph_us([call], DEV, TIMER, estimate_us=20.0)
        topk_kernels.KERNELS = True
        tiles = {}
        for chunk, warps in TILES if applies else []:
            topk_kernels.CHUNK, topk_kernels.WARPS = chunk, warps
            if not topk_kernels.triton_topk_applies(x, k):  # too many chunk winners at this chunk
                continue
            got = topk_kernels.row_topk(x, k, log)
            if not (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])):
                bad.append(f"{name} chunk {chunk} warps {warps}")
            tiles[f"{chunk}/{warps}"] = graph_us([call], DEV, TIMER, estimate_us=20.0)
        topk_kernels.CHUNK, topk_kernels.WARPS = DEFAULT_TILE
        rows.append({"shape": name, "rows": r, "vocab": v, "k": k, "dtype": str(dtype), "log": log,
                     "kernels_apply": applies, "tiles_us": tiles, "torch_us": torch_us})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    names = [f"{c}/{w}" for c, w in TILES]
    lines = [
        "# topk-bench: row top-k, kernels vs torch.topk, CUDA-graph median us per call, H200",
        "",
        f"equality against a stable sort: {'**mismatches: ' + ', '.join(bad) + '**' if bad else 'all equal'}",
        "",
        f"MAX_K {topk_kernels.MAX_K}. Kernel columns: chunk / warps (default "
        f"{DEFAULT_TILE[0]}/{DEFAULT_TILE[1]}); '-': the kernels do not apply.",
        "",
        "| shape | rows x vocab | k | dtype | log | torch.topk us | " + " | ".join(names) + " |",
        "|---|---|--:|---|---|--:|" + "--:|" * len(names),
    ]
    for row in rows:
        cells = [f"{row['tiles_us'][n]:.1f}" if n in row["tiles_us"] else "-" for n in names]
        lines.append(
            f"| {row['shape']} | {row['rows']} x {row['vocab']} | {row['k']} | {row['dtype']} | "
            f"{row['log']} | {row['torch_us']:.1f} | " + " | ".join(cells) + " |"
        )
    md = "\n".join(lines) + "\n"
    (out / "topk-bench.md").write_text(md)
    (out / "topk-bench.json").write_text(json.dumps({"rows": rows, "mismatches": bad}, indent=1))
    print(md)
    return 3 if bad else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
