"""GEMV weight prefetch into L2 before griddepcontrol.wait, bounded per row (triton_linear.L2_ROW_BYTES):
decode steps at the gdn-1.3b and qwen3.6-27b shapes, pdl.py's method (graph of REPS steps, median of
replays, first logits bitwise). python3 scripts/gpu/dev-l2.py OUT_DIR"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pdl  # noqa: E402

from repro.bench.model import MODEL_SHAPES, build_model, weight_bytes  # noqa: E402
from repro.bench.timing import TimerConfig, measure_ceilings  # noqa: E402
from repro.gdn import triton_linear as tlin  # noqa: E402
from repro.models.config import GDN  # noqa: E402
from repro.models.static import StaticDecoder  # noqa: E402

VARIANTS = {"auto": ("off", 0), "l2_512": ("l2", 512), "l2_2k": ("l2", 2048), "l2_8k": ("l2", 8192)}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)  # noqa: E702
    copy = measure_ceilings(torch.device("cuda"), TimerConfig(warmup_ms=1.0, rep_ms=3.0))["copy_GBps"]
    rows = []
    for shape in ("gdn-1.3b", "qwen3.6-27b"):
        model = build_model(MODEL_SHAPES[shape](), torch.device("cuda"), torch.bfloat16, 0)
        model.set_gdn_backend("triton")
        floor = weight_bytes(model) / (copy * 1e3)
        attention = any(t != GDN for t in model.config.layer_types)
        dec = StaticDecoder(model, 256, 33, gemv=True, fuse_decode=False, fuse_verify=False,
                            tree_attention_decode=attention)  # fmt: skip
        state = dec.export()
        reps = pdl.REPS[shape]
        graphs, firsts = {}, {}
        for name, (early, row_bytes) in VARIANTS.items():
            tlin.L2_ROW_BYTES = row_bytes
            graphs[name], firsts[name] = pdl.capture(dec, state, reps, (True, early, "auto"))
        times = {name: [] for name in VARIANTS}
        for _ in range(pdl.REPLAYS):
            for name in VARIANTS:
                times[name].append(pdl.replay_us(dec, state, graphs[name], reps))
        for name in VARIANTS:
            us = statistics.median(times[name])
            same = bool(torch.equal(firsts["auto"], firsts[name]))
            rows.append(dict(shape=shape, variant=name, us=us, floor_us=floor, equal=same))
            print(f"{shape} {name} {us:.1f} us ({100 * floor / us:.1f}% of floor) equal={same}", flush=True)
        del graphs, dec, model
        torch.cuda.empty_cache()
    (out / "dev-l2.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
