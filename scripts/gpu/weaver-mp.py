"""Weaver's fused growth on P programs (grid barriers): exactness, then timing, on the H200.

    python scripts/gpu/weaver-mp.py OUT_DIR      writes OUT_DIR/weaver-mp.json and .md, prints the markdown

Random weights and inputs (``shapes.growth_problem``) at the tiny family's Weaver shape
(d_model 128, target hidden 192, pool 512, budget 32) and at the Qwen3.6-27B Weaver shape (d_model
2048, 16 heads, intermediate 4096, target hidden 5120, pool 512, budget 64), bfloat16:

1. check: the torch device growth (``grow_on_device``) vs ``grow_fused`` on each P of the sweep:
   same tree (or the first difference at a near tie), score error, bitwise equal to the sweep's first
   P, the barrier error flag (must be 0).
2. timing: one full growth (budget + 1 node launches and grow_fused's four torch ops) in CUDA graphs
   (``repro.bench.timing.graph_us``): us per growth and per node, per (num_warps, P), then two other
   (tile, unroll) at num_warps 8 and the largest P, and the torch growth. At the 27B shape first: more
   than one program a SM (``RESIDENT``; grow_fused clamps P to what the SMs hold at once, the row
   says which P ran), each row's tree checked bitwise against the default P's, its flag 0. P = 1 at
   the 27B shape is left out (one SM walking 126 MB of weights a node; ``fits`` refuses it).

Every distinct launch configuration compiles once (P > 1 shares one binary per num_warps); the JSON
and markdown are rewritten after each section, and timing stops at a time guard (the run stays
under 90 s).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.timing import TimerConfig, graph_us  # noqa: E402
from repro.drafters.growth_kernels import device_programs, fits, grow_fused  # noqa: E402
from repro.drafters.shapes import growth_problem  # noqa: E402
from repro.drafters.weaver_growth import grow_on_device  # noqa: E402

DEV = torch.device("cuda")
DTYPE = torch.bfloat16
SHAPES = ("qwen3.6-27b", "tiny")
WARPS = (8, 4)
RESIDENT = ((8, 1), (4, 2), (4, 4), (16, 1))  # 27B: (num_warps, programs a SM), clamped to residency
OPTIONS = ((16384, 1), (8192, 2))  # (tile, unroll) beside the default (8192, 1), num_warps 8, the last P
GUARD_S = 110.0  # no new timing row after this many seconds
CFG = TimerConfig(warmup_ms=2.0, rep_ms=8.0, graph_replays=3)


def sweep(shape: str) -> list[int]:
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    return [1, 4, 16, 32] if shape == "tiny" else [16, 32, 66, sms]


def first_difference(a, b) -> int | None:  # noqa: ANN001
    ta, tb = (
        list(zip(a.tokens.tolist(), a.parents.tolist())),
        list(zip(b.tokens.tolist(), b.parents.tolist())),
    )
    return next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)


def check(shape: str) -> list[dict]:
    args = growth_problem(shape, DTYPE, DEV, seed=0)
    ref = grow_on_device(*args)
    first = None
    out = []
    for p in sweep(shape):
        got = grow_fused(*args, programs=p)
        torch.cuda.synchronize()
        diff = first_difference(ref, got)
        real = ~ref.scores.isinf()
        row = {
            "shape": shape, "programs": p, "same_as_torch": diff is None, "first_difference_vs_torch": diff,
            "max_score_error_vs_torch": float((ref.scores[real] - got.scores[real]).abs().max()),
            "error_flag": int(got.error),
        }  # fmt: skip
        if diff is not None:  # a near tie: the scores at the first difference agree
            row["score_gap_at_first_difference"] = float((ref.scores[diff] - got.scores[diff]).abs())
        if first is None:
            first = got
        row["bitwise_vs_first_p"] = first_difference(first, got) is None and torch.equal(
            first.scores, got.scores
        )
        out.append(row)
    return out


def jobs() -> list[tuple[str, int, int, int, int]]:
    """(shape, num_warps, P, tile, unroll), most telling first (a run cut short keeps those): the 27B
    default (num_warps 8, two programs a SM), then one and more than two programs a SM (RESIDENT: the
    memory parallelism that bounds one CTA a SM), both shapes' P sweeps at num_warps 8, then 4, then the other
    launch options at the 27B shape."""
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    first = [(SHAPES[0], 8, 2 * sms, 8192, 1)] + [(SHAPES[0], w, m * sms, 8192, 1) for w, m in RESIDENT]
    out = [(shape, w, p, 8192, 1) for w in WARPS for shape in SHAPES for p in sweep(shape)]
    out = [j for j in out if not (j[0] != "tiny" and j[2] == 1) and j not in first]
    return first + out + [(SHAPES[0], 8, sweep(SHAPES[0])[-1], tile, unroll) for tile, unroll in OPTIONS]


def timing(res: dict, started: float, write) -> None:  # noqa: ANN001
    """Fill ``res['timing'][shape]``: the torch growth, then the fused growth per job, until GUARD_S."""
    problems = {}
    for shape in SHAPES:
        args = growth_problem(shape, DTYPE, DEV, seed=1)
        nodes = args[2] + 1
        t_us = graph_us([lambda a=args: grow_on_device(*a)], DEV, CFG, 3000.0 if shape == "tiny" else 20000.0)
        res["timing"][shape] = {
            "nodes": nodes,
            "torch_us": t_us,
            "torch_us_per_node": t_us / nodes,
            "fused": [],
        }
        problems[shape] = args
    for shape, warps, p, tile, unroll in jobs():
        if time.perf_counter() - started > GUARD_S:
            res["timing"]["cut_short"] = True
            return
        args, row = problems[shape], res["timing"][shape]

        def fn(a=args, w=warps, p=p, t=tile, u=unroll) -> object:  # noqa: ANN001
            return grow_fused(*a, num_warps=w, tile=t, unroll=u, programs=p)

        got = fn()  # the programs after the residency clamp; checked against the default P's tree
        ref = grow_fused(*args, num_warps=warps, tile=tile, unroll=unroll)  # (at the same launch options)
        same = first_difference(ref, got) is None and torch.equal(ref.scores, got.scores)
        us = graph_us([fn], DEV, CFG, 1000.0)
        row["fused"].append(
            {
                "num_warps": warps,
                "programs_asked": p,
                "programs": got.programs,
                "error_flag": int(got.error),
                "same_as_default_p": same,
                "tile": tile,
                "unroll": unroll,
                "us": us,
                "us_per_node": us / row["nodes"],
            }
        )
        write()


def markdown(res: dict) -> str:
    lines = [
        f"# weaver-mp: Weaver's fused growth on P programs ({res['device']}, {res['seconds']:.0f} s)",
        "",
    ]
    lines.append(f"default programs (device_programs): {res['default_programs']}; fits: {res['fits']}")
    if "check" in res:
        lines += ["", "## Check (bf16, seed 0)", ""]
        lines += ["| shape | P | = torch | first diff | max score err | bitwise vs first P | error flag |"]
        lines += ["|---|---:|---|---:|---:|---|---:|"]
        for r in res["check"]:
            lines.append(
                f"| {r['shape']} | {r['programs']} | {r['same_as_torch']} | "
                f"{r['first_difference_vs_torch']} | {r['max_score_error_vs_torch']:.2e} | "
                f"{r['bitwise_vs_first_p']} | {r['error_flag']} |"
            )
    for shape in SHAPES:
        t = res.get("timing", {}).get(shape)
        if not t:
            continue
        lines += ["", f"## One growth in CUDA graphs, {shape} (bf16, {t['nodes']} nodes)", ""]
        lines += ["| growth | num_warps | P (asked) | tile, unroll | us / growth | us / node | x torch | "
                  "= default P | flag |"]  # fmt: skip
        lines += ["|---|---:|---:|---|---:|---:|---:|---|---:|"]
        lines.append(f"| torch | - | - | - | {t['torch_us']:.0f} | {t['torch_us_per_node']:.1f} | 1.00 | | |")
        for f in t["fused"]:
            lines.append(
                f"| fused | {f['num_warps']} | {f['programs']} ({f['programs_asked']}) | "
                f"{f.get('tile', 8192)}, {f.get('unroll', 1)} | {f['us']:.0f} | {f['us_per_node']:.1f} | "
                f"{t['torch_us'] / f['us']:.2f} | {f['same_as_default_p']} | {f['error_flag']} |"
            )

    if res.get("timing", {}).get("cut_short"):
        lines.append("\n(timing cut short by the time guard)")
    return "\n".join(lines) + "\n"


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    res["default_programs"], res["fits"] = {}, {}
    for shape in SHAPES:
        w, _, budget, *_rest, pool_ids, _f = growth_problem(shape, DTYPE, DEV, seed=0)
        pool = pool_ids.shape[1]
        p = device_programs(w.config, budget, pool, DEV)
        res["default_programs"][shape] = p
        res["fits"][shape] = {"1": fits(w.config, budget, pool), str(p): fits(w.config, budget, pool, p)}

    def write() -> str:
        res["seconds"] = time.perf_counter() - started
        (out_dir / "weaver-mp.json").write_text(json.dumps(res, indent=1))
        md = markdown(res)
        (out_dir / "weaver-mp.md").write_text(md)
        return md

    res["check"] = [row for shape in SHAPES for row in check(shape)]
    write()
    print(f"check done at {res['seconds']:.0f} s", flush=True)
    res["timing"] = {}
    timing(res, started, write)
    print(write())
    timed = [f for shape in SHAPES for f in res["timing"].get(shape, {}).get("fused", [])]
    bad = [r for r in res["check"] if r["error_flag"] or not r["bitwise_vs_first_p"]]
    bad += [f for f in timed if f["error_flag"] or not f["same_as_default_p"]]
    if bad:
        print(f"FAILED: {len(bad)} check rows (error flag set or not bitwise across P)")
        sys.exit(3)


if __name__ == "__main__":
    main()
