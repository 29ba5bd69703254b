"""Launch configurations of the row-tiled linears (repro.gdn.triton_linear, verify) per matrix, on the H200,
and the verify step they make at the GDN-1.3B shape.

    python3 scripts/gpu/rows-tune.py OUT_DIR [SHAPES [ROWS]]      (one H200: < 6 min)

SHAPES: comma-separated, of gdn-1.3b, qwen3.6-27b (default both) and tiny-qwen35 (the embedded target's
layout); ROWS: comma-separated row counts of x (default 64).

1. every distinct matmul of each shape (gemv-tune.py's matrices; the LM head as norm_linear, as verify
   runs it), bf16 random weights, x of each ROWS rows: cuBLAS (``F.linear`` alone, without the norm /
   SiLU * up / residual launches the fused kernel also does) against the row-tiled kernel at its
   current configuration ("current": ``row_tiles``, so TUNED_ROWS where it has the matrix, else the
   untuned defaults) and a bounded sweep (RowsConfig: block_n x block_k tiles on 4 / 8 warps, 3 / 4
   stages; at 3562a89 the kernel also had split-K and a one-dot "no lo" mode, swept there:
   results/2026-12-03-h200-rows-tune/callQ): each checked against the torch composition in float32 (not
   timed past 2e-2), then timed as one CUDA graph of >= 16 calls cycling through enough weight copies to
   move 3x the L2 per cycle; us, % of the measured copy bandwidth, the best configuration. Matrices not
   started by BUDGET_S are skipped. At the tiny width (K <= 1024) the sweep is TINY_TILES on 2 / 4 warps,
   2 / 3 stages (64-row blocks also as two of 32 rows).
2. the verify step of gdn-1.3b (random weights) or tiny-qwen35 (the trained target) (StaticDecoder.verify
   of best-first trees of ROWS nodes after a 64-token prefill, graphed): cuBLAS matmuls (``fuse_verify``
   off) against the row-tiled kernels at the untuned defaults (TUNED_ROWS emptied) and with part 1's best
   configurations (placed in
   ``TUNED_ROWS`` for the capture); logits against the cuBLAS verify.

``ROWS_TUNE_FOLD=1``: part 1's normed kinds run on their weights with the norm scale folded in
(``folded=``, :func:`repro.gdn.triton_linear.fold_norm`: x enters the dots as it is, one dot a K step),
as the StaticDecoder's verify does by default (``fold_norms``); part 2 takes the decoder's default.

Writes OUT_DIR/rows-tune.json and OUT_DIR/rows-tune.md; prints the markdown and the ``TUNED_ROWS`` lines.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.kernels import graph_sets  # noqa: E402
from repro.bench.model import MODEL_SHAPES, build_model  # noqa: E402
from repro.bench.timing import TimerConfig, measure_ceilings  # noqa: E402
from repro.gdn import triton_linear as tlin  # noqa: E402
from repro.gdn.triton_linear import RowsConfig  # noqa: E402
from repro.models.family import resolve_checkpoint  # noqa: E402
from repro.models.loading import read_config  # noqa: E402
from repro.models.target import open_target  # noqa: E402


def _script(name: str) -> Any:
    """A sibling script as a module (its helpers, not copies of them)."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(mod)
    return mod


gemv_tune = _script("gemv-tune")
verify_rows = _script("verify-rows")
Matrix = gemv_tune.Matrix
Operands = gemv_tune.Operands
fmt = gemv_tune.fmt

START = time.perf_counter()
BUDGET_S = 200.0  # part 1: matrices not started by then are skipped; part 2 (~60 s) follows
MIN_CALLS, MIN_GRAPH_US = 16, 300.0
WORKERS = max(1, min(14, (os.cpu_count() or 2) - 2))
PRECOMPILE_TIMEOUT_S = 120.0
BF16 = torch.bfloat16
FOLD = os.environ.get("ROWS_TUNE_FOLD") == "1"  # the normed kinds on fold_norm's weights (x unscaled)
# (block_n, block_k, warps): output columns x K columns per step (gate|up: two such tiles)
TILES = [(16, 128, 4), (32, 64, 4), (32, 128, 4), (64, 64, 4), (64, 64, 8), (64, 128, 8), (128, 64, 8)]
TINY_TILES = [(bn, bk) for bn in (16, 32, 64) for bk in (64, 128, 256)]


def matrices(shape: str) -> list[Matrix]:
    config = read_config(resolve_checkpoint(shape)) if shape == "tiny-qwen35" else None
    out = []
    for m in gemv_tune.decode_matrices(shape, config):
        kind = "norm_linear" if m.kind == "norm_linear_argmax" else m.kind
        out.append(dataclasses.replace(m, kind=kind))
    return out


def sweep(m: Matrix, n: int) -> list[tuple[str, RowsConfig]]:
    """row_tiles' current choice ("current"), then TILES x stages 3 / 4 (14 configurations a matrix); at
    K <= 1024 TINY_TILES x warps 2 / 4 x stages 2 / 3 (36), and for 64-row blocks the same on 32-row
    blocks (4 warps; 18 more)."""
    out = [("current", tlin.row_tiles(n, m.n, m.k, True, m.kind))]
    bm = max(16, min(64, tlin.pow2(n)))
    if m.k <= 1024:
        for bn, bk in TINY_TILES:
            for warps in (2, 4):
                for stages in (2, 3):
                    out.append((f"{bn}x{bk} w{warps} s{stages}", RowsConfig(bm, bn, bk, warps, stages)))
                    if bm == 64 and warps == 4:  # two row blocks of 32: twice the programs
                        out.append((f"m32 {bn}x{bk} w4 s{stages}", RowsConfig(32, bn, bk, 4, stages)))
    else:
        for bn, bk, warps in TILES:
            for stages in (3, 4):
                out.append((f"{bn}x{bk} w{warps} s{stages}", RowsConfig(bm, bn, bk, warps, stages)))
    seen, unique = set(), []
    for label, cfg in out:
        if cfg not in seen:
            seen.add(cfg)
            unique.append((label, cfg))
    return unique


def fused_call(
    m: Matrix, o: Operands, w: torch.Tensor, cfg: RowsConfig, folded: torch.Tensor | None = None
) -> Callable[[], torch.Tensor]:
    """The row-tiled launch of ``m`` at ``cfg`` (``folded``: the normed kinds on fold_norm's weight)."""
    blocks = dataclasses.asdict(cfg)
    if m.kind == "norm_linear":
        return lambda: tlin.norm_linear(o.x, o.scale, 1e-6, w, folded=folded, **blocks)
    if m.kind == "norm_gate_up":
        return lambda: tlin.norm_gate_up(o.x, o.scale, 1e-6, w, folded=folded, **blocks)
    return lambda: tlin.linear_residual(o.x, w, o.residual, **blocks)


def folded_weights(m: Matrix, o: Operands) -> list[torch.Tensor | None]:
    """With FOLD, each weight copy of a normed kind with the norm scale folded in, else Nones."""
    if not FOLD or m.kind == "linear_residual":
        return [None] * len(o.weights)
    return [tlin.fold_norm(w, o.scale) for w in o.weights]


def _warm(job: tuple[Matrix, int, list[RowsConfig]]) -> int:
    """Worker: launch every configuration once on uninitialised operands (fills Triton's file cache)."""
    m, n, cfgs = job
    o = gemv_tune.operands(m, 1, init=False, rows=n)
    folded = folded_weights(m, o)[0]
    for cfg in cfgs:
        try:
            fused_call(m, o, o.weights[0], cfg, folded)()
        except Exception:  # noqa: BLE001, S112 - the sweep records the error when it runs this one
            continue
    torch.cuda.synchronize()
    return len(cfgs)


def precompile(matrix_rows: list[tuple[Matrix, int]]) -> float:
    t0 = time.perf_counter()
    jobs = []
    for m, n in matrix_rows:
        cfgs = [c for _, c in sweep(m, n)]
        jobs += [(m, n, cfgs[i : i + 4]) for i in range(0, len(cfgs), 4)]
    with mp.get_context("spawn").Pool(WORKERS) as pool:
        pool.map_async(_warm, jobs, chunksize=1).get(timeout=PRECOMPILE_TIMEOUT_S)
    return time.perf_counter() - t0


def bench_matrix(m: Matrix, n: int, copy_gbps: float) -> list[dict[str, Any]]:
    sets = graph_sets(torch.device("cuda"), m.nbytes)
    o = gemv_tune.operands(m, sets, rows=n)
    ref = gemv_tune.reference(m, o)
    est_us = m.nbytes / 3e3
    calls = max(MIN_CALLS, math.ceil(MIN_GRAPH_US / est_us))
    calls += -calls % sets

    def row(label: str, cfg: RowsConfig | None, us: float | None, err: float | None, status: str) -> dict:
        return dict(
            shape=m.shape, matrix=m.name, kind=m.kind, n=m.n, k=m.k, rows=n, MB=m.nbytes / 1e6,
            method="fused" if cfg else "cublas", config=label, cfg=dataclasses.asdict(cfg) if cfg else None,
            rel_err=err, us=us,
            pct_copy=100 * m.nbytes / us / 1e3 / copy_gbps if us else None, status=status,
        )  # fmt: skip

    x = o.x
    cublas = gemv_tune.graph_time([lambda w=w: F.linear(x, w) for w in o.weights], calls, est_us)
    rows = [row("cuBLAS F.linear", None, cublas, None, "ok")]
    folded = folded_weights(m, o)
    for label, cfg in sweep(m, n):
        try:
            err = gemv_tune.rel(fused_call(m, o, o.weights[0], cfg, folded[0])(), ref)
            if not err <= 2e-2:
                rows.append(row(label, cfg, None, err, "FAIL"))
                continue
            calls_ = [fused_call(m, o, w, cfg, f) for w, f in zip(o.weights, folded)]
            us = gemv_tune.graph_time(calls_, calls, est_us)
            rows.append(row(label, cfg, us, err, "ok"))
        except Exception as exc:  # noqa: BLE001 - one broken configuration must not stop the sweep
            rows.append(row(label, cfg, None, None, f"error: {type(exc).__name__}: {exc}"[:200]))
    del o
    torch.cuda.empty_cache()
    return rows


def rows_key(r: dict[str, Any]) -> tuple[str, int, int, int]:
    """A best row's TUNED_ROWS key: its matrix and the default block_m of its row count."""
    return r["kind"], r["n"], r["k"], max(16, min(64, tlin.pow2(r["rows"])))


def verify_step(shape: str, best: dict[str, dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    """verify(T) for T in ``sizes``: fuse_verify off, on at the untuned defaults, on with the best table."""
    if shape == "tiny-qwen35":
        model, _ = open_target("default", "bfloat16", "cuda")
    else:
        model = build_model(MODEL_SHAPES[shape](), torch.device("cuda"), BF16, 0)
    model.set_gdn_backend("triton")
    state = verify_rows.prefilled(model)
    table = {rows_key(r): RowsConfig(**r["cfg"]) for r in best.values() if r["shape"] == shape}
    rows = []
    for t in sizes:
        for label, entries in (("untuned defaults", {}), ("best of sweep", table)):
            tlin.TUNED_ROWS.clear()
            tlin.TUNED_ROWS.update(entries)
            for r in verify_rows.verify_pair(model, state, t, True, timed=True):
                if r["fuse_verify"] or label == "untuned defaults":
                    r.update(shape=shape, rows_configs=label if r["fuse_verify"] else "cuBLAS")
                    rows.append(r)
    tlin.TUNED_ROWS.clear()
    del model
    torch.cuda.empty_cache()
    return rows


def markdown(res: dict[str, Any]) -> str:
    lines = [
        f"# Row-tiled linears (triton_linear, verify) vs cuBLAS at {res['n_rows']} rows, H200"
        + (" (normed kinds on folded weights)" if res.get("folded") else ""),
        "",
        f"copy bandwidth {res['copy_GBps']:.0f} GB/s; precompile {fmt(res['precompile_s'])} s; total "
        f"{res['elapsed_s']:.0f} s; skipped: {', '.join(res['skipped']) or 'none'}. cuBLAS times the matmul "
        "alone; the fused kernel also does the norm / SiLU * up / residual.",
        "",
        "| shape | rows | matrix | kind | N x K | MB | cuBLAS us | current us | best us | best % copy "
        "| best config | best vs cuBLAS | best vs current |",
        "|---|--:|---|---|---|--:|--:|--:|--:|--:|---|--:|--:|",
    ]
    by: dict[tuple, list] = {}
    for r in res["rows"]:
        by.setdefault((r["shape"], r["kind"], r["n"], r["k"], r["rows"]), []).append(r)
    for (shape, kind, n, k, rows), rs in by.items():
        get = {r["config"]: r for r in rs}
        b = res["best"].get(f"{shape}:{kind}/{n}x{k}/n{rows}")
        cub, dft = get["cuBLAS F.linear"]["us"], get.get("current", {}).get("us")
        lines.append(
            f"| {shape} | {rows} | {rs[0]['matrix']} | {kind} | {n} x {k} | {rs[0]['MB']:.1f} | {fmt(cub)} | "
            f"{fmt(dft)} | {fmt(b and b['us'])} | {fmt(b and b['pct_copy'], '.0f')} | "
            f"{b['config'] if b else '-'} | {fmt(cub / b['us'] if b else None, '.2f')}x | "
            f"{fmt(dft / b['us'] if b and dft else None, '.2f')}x |"
        )
    lines += ["", "## The verify step (graphed)", ""]
    lines += [
        "| shape | T | matmuls | verify us | kernels | logits err vs cuBLAS | top1 |",
        "|---|--:|---|--:|--:|--:|--:|",
    ]
    for r in res["verify"]:
        lines.append(
            f"| {r['shape']} | {r['T']} | {r['rows_configs']} | {r['us']:.1f} | {r['kernels']} | "
            f"{r['logits_err_vs_off']:.1e} | {r['top1_vs_off']:.3f} |"
        )
    lines += ["", "Every configuration (us):", ""]
    for (shape, kind, n, k, rows), rs in by.items():
        cells = ", ".join(
            f"{r['config']} {fmt(r['us'])}" + ("" if r["status"] == "ok" else f" {r['status']}") for r in rs
        )
        lines.append(f"- {shape} {kind} {n}x{k} at {rows} rows: {cells}")
    entry = lambda b: f"{rows_key(b)}: RowsConfig"  # noqa: E731
    lines += gemv_tune.table_entries(res["best"], "TUNED_ROWS entries:", entry)
    return "\n".join(lines) + "\n"


def main() -> None:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "rows-tune-out")
    shapes = (sys.argv[2] if len(sys.argv) > 2 else "gdn-1.3b,qwen3.6-27b").split(",")
    sizes = [int(v) for v in (sys.argv[3] if len(sys.argv) > 3 else "64").split(",")]
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(m, n) for shape in shapes for m in matrices(shape) for n in sizes]
    try:
        pre_s = precompile(jobs)
        print(f"precompiled in {pre_s:.1f} s", flush=True)
    except Exception as exc:  # noqa: BLE001 - the rest compiles on first launch
        pre_s = math.nan
        print(f"precompile stopped ({type(exc).__name__}: {exc})", flush=True)
    ceilings = measure_ceilings(torch.device("cuda"), TimerConfig(warmup_ms=5, rep_ms=20))
    copy_gbps = float(ceilings["copy_GBps"])
    rows, skipped = [], []
    for m, n in jobs:
        if time.perf_counter() - START > BUDGET_S:
            skipped.append(f"{m.shape} {m.name} n{n}")
            continue
        rows += bench_matrix(m, n, copy_gbps)
        print(f"{time.perf_counter() - START:5.1f} s  {m.shape} {m.name} {m.key} n{n}", flush=True)
    best = gemv_tune.best_rows(rows, per_rows=True)
    res: dict[str, Any] = dict(
        device=torch.cuda.get_device_name(), n_rows=",".join(map(str, sizes)), copy_GBps=copy_gbps,
        precompile_s=pre_s, skipped=skipped, rows=rows, best=best, verify=[], folded=FOLD,
    )  # fmt: skip
    (out_dir / "rows-tune.json").write_text(json.dumps(res, indent=1, default=str))
    for shape in shapes:
        if shape in ("gdn-1.3b", "tiny-qwen35"):
            res["verify"] += verify_step(shape, best, sizes)
    res["elapsed_s"] = time.perf_counter() - START
    md = markdown(res)
    (out_dir / "rows-tune.json").write_text(json.dumps(res, indent=1, default=str))
    (out_dir / "rows-tune.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
