"""The verify step's matmuls against their row count M at the real shapes (cuBLAS, bf16, H200).

    python3 scripts/gpu/verify-m.py OUT_DIR      (one H200: < 90 s)

2026-12-02's scale rows verify DFlash-TfM's 65-node trees (root + budget 64) as 65 rows: 19.9 ms at the
Qwen3.6-27B shape where ``repro bench model``'s verify(64) took 17.1 ms. This script asks whether the
65th row is what costs: every distinct weight matrix of the model (``torch.nn.Linear`` of one layer of
each kind, built on the meta device, counted over the model's layers; the LM head once) is timed by
``F.linear`` at M = 1 ... 128 rows in CUDA graphs (``repro.bench.timing.graph_us``), cycling through
enough copies of the weight that no replay finds it in L2. Per M: the summed matmul time of one verify
(each matrix's time x its count), its ratio to M = 1 and to M = 64, and the weight-bandwidth floor
(bytes / 4.2 TB/s, the copy bandwidth the bench model measures on this H200). Shapes: qwen3.6-27b,
gdn-1.3b. Writes OUT_DIR/verify-m.json and OUT_DIR/verify-m.md and prints the markdown.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.model import MODEL_SHAPES  # noqa: E402
from repro.bench.timing import TimerConfig, graph_us  # noqa: E402
from repro.models.config import HybridConfig  # noqa: E402
from repro.models.hybrid import HybridLM  # noqa: E402

DEV = torch.device("cuda")
DTYPE = torch.bfloat16
ROWS = (1, 16, 32, 33, 48, 64, 65, 72, 80, 96, 128)
SHAPES = ("qwen3.6-27b", "gdn-1.3b")
COPY_BW = 4.2e12  # bytes/s: the H200's measured copy bandwidth (bench model's ceiling, 2026-12-02)
FLUSH_BYTES = 256 << 20  # weight copies a graph cycles through (5x the 50 MB L2)
CFG = TimerConfig(warmup_ms=1.0, rep_ms=6.0, graph_replays=3)


def matrices(config: HybridConfig) -> collections.Counter[tuple[int, int]]:
    """(out, in) of every Linear weight one decode or verify step reads, with its count in the model."""
    per_kind: dict[str, collections.Counter] = {}
    with torch.device("meta"):
        for kind in dict.fromkeys(config.layer_types):
            one = HybridLM(_one_layer(config, kind))
            per_kind[kind] = collections.Counter(
                tuple(m.weight.shape) for name, m in one.named_modules()
                if isinstance(m, torch.nn.Linear) and "lm_head" not in name
            )  # fmt: skip
    total: collections.Counter[tuple[int, int]] = collections.Counter()
    for kind in config.layer_types:
        total.update(per_kind[kind])
    total[(config.vocab_size, config.hidden_size)] += 1  # the LM head (verify reads every row's logits)
    return total


def _one_layer(config: HybridConfig, kind: str) -> HybridConfig:
    return dataclasses.replace(config, layer_types=[kind])


def time_matrix(n: int, k: int, rows: tuple[int, ...]) -> dict[int, float]:
    copies = max(1, -(-FLUSH_BYTES // (2 * n * k)))
    ws = [torch.randn(n, k, device=DEV, dtype=DTYPE) * 0.02 for _ in range(copies)]
    out = {}
    for m in rows:
        x = torch.randn(m, k, device=DEV, dtype=DTYPE)
        ys = [torch.empty(m, n, device=DEV, dtype=DTYPE) for _ in ws]
        fns = [lambda x=x, w=w, y=y: torch.matmul(x, w.t(), out=y) for w, y in zip(ws, ys)]
        est = max(2.0, 2 * n * k / COPY_BW * 1e6)
        out[m] = graph_us(fns, DEV, CFG, est)
    del ws
    torch.cuda.empty_cache()
    return out


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    res: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rows": ROWS,
        "shapes": {},
    }
    for shape in SHAPES:
        config = MODEL_SHAPES[shape]()
        mats = matrices(config)
        per = {f"{n}x{k}": {"count": c, "us": time_matrix(n, k, ROWS)} for (n, k), c in mats.items()}
        total = {m: sum(v["count"] * v["us"][m] for v in per.values()) for m in ROWS}
        nbytes = sum(2 * n * k * c for (n, k), c in mats.items())
        res["shapes"][shape] = {"matrices": per, "total_us": total, "weight_bytes": nbytes,
                                "floor_us": nbytes / COPY_BW * 1e6}  # fmt: skip
        print(f"{shape} done at {time.perf_counter() - start:.0f} s", flush=True)
    res["seconds"] = time.perf_counter() - start
    (out_dir / "verify-m.json").write_text(json.dumps(res, indent=1))
    md = markdown(res)
    (out_dir / "verify-m.md").write_text(md)
    print(md)


def markdown(res: dict) -> str:
    lines = [
        f"# verify-m: a step's matmuls (cuBLAS, bf16) by row count ({res['device']}, {res['seconds']:.0f} s)"
    ]
    for shape, s in res["shapes"].items():
        t, floor = s["total_us"], s["floor_us"]
        lines += ["", f"## {shape}: {len(s['matrices'])} distinct matrices, floor {floor:.0f} us", ""]
        lines += ["| M | matmuls us | x M=1 | x M=64 | % of floor |", "|--:|--:|--:|--:|--:|"]
        for m in res["rows"]:
            lines.append(
                f"| {m} | {t[m]:.0f} | {t[m] / t[1]:.2f} | {t[m] / t[64]:.3f} | {100 * floor / t[m]:.0f}% |"
            )
        lines += ["", "| matrix | count | " + " | ".join(f"M={m}" for m in res["rows"]) + " |"]
        lines += ["|---|--:|" + "--:|" * len(res["rows"])]
        for name, v in s["matrices"].items():
            lines.append(
                f"| {name} | {v['count']} | " + " | ".join(f"{v['us'][m]:.1f}" for m in res["rows"]) + " |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
