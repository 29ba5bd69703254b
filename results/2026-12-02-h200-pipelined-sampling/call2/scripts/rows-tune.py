"""Launch configurations of the row-tiled (verify) linears (repro.gdn.triton_linear) at GDN-1.3B, on the H200.

    python3 scripts/gpu/rows-tune.py OUT_DIR      (one H200: < 5 min)

1. every distinct verify matmul of the gdn-1.3b shape (gemv-tune.py's decode matrices; the LM head as
   norm_linear over all rows), bf16 random weights, at T = 16, 33, 64 rows: cuBLAS (``F.linear``, the matmul
   alone, none of the glue the fused kernel folds in) against the fused kernel at its default
   (``row_tiles``) and a sweep (row block x 32/64/128 columns x 64/128 K columns, 4/8 warps, split-K 1/2/4/8):
   each checked against the torch composition in float32 (not timed past 2e-2), then timed as one CUDA
   graph cycling through enough weight copies to move 3x the L2 per cycle; us, % of the measured copy
   bandwidth, the best configuration per (matrix, row block) as a ``TUNED_ROWS`` entry. Rows not started by
   BUDGET_S are skipped (listed).
2. the gdn-1.3b verify step (random bf16 weights, a prefilled state, best-first trees of 16 / 33 / 64 nodes,
   CUDA-graph medians): ``fuse_verify`` off (cuBLAS + glue: the engine's default at this width) against on
   with the default tiles and with the best found in 1 (``TUNED_ROWS`` filled before capture), beside the
   decode step (GEMV kernels, as the graphed engine runs it): us and ratio to the decode step (issue 13's
   verify / decode target: <= 1.2x), the logits against the off path's.

The fused kernels of every (matrix, configuration) are compiled first in worker processes sharing Triton's
file cache. Writes OUT_DIR/rows-tune.json and OUT_DIR/rows-tune.md; prints the markdown.
"""

from __future__ import annotations

import importlib.util
import json
import math
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.kernels import graph_sets  # noqa: E402
from repro.bench.model import build_model, gdn_1p3b  # noqa: E402
from repro.bench.shapes import draft_tree  # noqa: E402
from repro.bench.timing import TimerConfig, graph_us, measure_ceilings  # noqa: E402
from repro.gdn import triton_linear as tlin  # noqa: E402
from repro.gdn.triton_linear import RowsConfig  # noqa: E402
from repro.models.graphs import GraphedCall  # noqa: E402
from repro.models.layers import rms_norm  # noqa: E402
from repro.models.static import StaticDecoder, TreeSlot  # noqa: E402
from repro.tree import Tree  # noqa: E402

_spec = importlib.util.spec_from_file_location("gemv_tune", Path(__file__).with_name("gemv-tune.py"))
gemv_tune = sys.modules["gemv_tune"] = importlib.util.module_from_spec(_spec)  # its dataclasses look it up
_spec.loader.exec_module(gemv_tune)  # type: ignore[union-attr]

DEV = torch.device("cuda")
BF16 = torch.bfloat16
START = time.perf_counter()
BUDGET_S = 170.0  # sweep rows not started by then are skipped; the verify rows (~40 s) follow
ROWS = (33, 64, 16)
MIN_CALLS, MIN_GRAPH_US, REPLAYS = 8, 300.0, 5
WORKERS = max(1, min(14, (os.cpu_count() or 2) - 2))
PRECOMPILE_TIMEOUT_S = 70.0
TIMER = TimerConfig(warmup_ms=2.0, rep_ms=10.0, graph_replays=5)


def matrices() -> list[Any]:
    out = []
    for m in gemv_tune.decode_matrices("gdn-1.3b"):
        kind = "norm_linear" if m.kind == "norm_linear_argmax" else m.kind
        out.append(gemv_tune.Matrix(m.shape, m.name, kind, m.n, m.k))
    return out


def block_ms(t: int) -> tuple[int, ...]:
    return (16,) if t <= 16 else (32, 64) if t <= 33 else (64,)


def sweep(m: Any, t: int) -> list[tuple[str, RowsConfig]]:
    """The default, then every (row block, 32/64/128 x 64/128 weight tile of <= 8192 weights, 4/8 warps
    (8 for 64-row blocks), split-K 1/2/4/8)."""
    out = [("default", tlin.row_tiles(t, m.n, m.k, True, m.kind))]
    for bm in block_ms(t):
        for bn in (32, 64, 128):
            for bk in (64, 128):
                for warps in (4, 8) if bm <= 32 else (8,):  # 64-row blocks on 4 warps: the register cap
                    for split in (1, 2, 4, 8):
                        if bn * bk > 8192:
                            continue
                        out.append(
                            (f"{bm}x{bn}x{bk} w{warps} s{split}", RowsConfig(bm, bn, bk, warps, 3, split))
                        )
    seen, unique = set(), []
    for i, (label, cfg) in enumerate(out):
        if cfg not in seen or i == 0:
            seen.add(cfg)
            unique.append((label, cfg))
    return unique


def operands(m: Any, t: int, sets: int, init: bool = True) -> dict[str, Any]:
    gen = torch.Generator(device="cuda").manual_seed(t)

    def rnd(*shape: int, s: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        if not init:
            return torch.empty(*shape, dtype=BF16, device="cuda")
        return (shift + s * torch.randn(*shape, generator=gen, device="cuda")).to(BF16)

    return {
        "weights": [rnd(m.rows, m.k, s=m.k**-0.5) for _ in range(sets)],
        "x": rnd(t, m.k, s=3.0),
        "scale": rnd(m.k, s=0.2, shift=1.0),
        "residual": rnd(t, m.n),
    }


def fused_call(m: Any, o: dict[str, Any], w: torch.Tensor, cfg: RowsConfig) -> Callable[[], torch.Tensor]:
    blocks = {f: getattr(cfg, f) for f in RowsConfig.__dataclass_fields__}
    if m.kind == "norm_linear":
        return lambda: tlin.norm_linear(o["x"], o["scale"], 1e-6, w, **blocks)
    if m.kind == "norm_gate_up":
        return lambda: tlin.norm_gate_up(o["x"], o["scale"], 1e-6, w, **blocks)
    return lambda: tlin.linear_residual(o["x"], w, o["residual"], **blocks)


def reference(m: Any, o: dict[str, Any]) -> torch.Tensor:
    x, w = o["x"].float(), o["weights"][0].float()
    if m.kind == "linear_residual":
        return o["residual"].float() + F.linear(x, w)
    y = F.linear(rms_norm(x, o["scale"].float(), 1e-6), w)
    return F.silu(y[:, : m.n]) * y[:, m.n :] if m.kind == "norm_gate_up" else y


def _warm(job: tuple[Any, int, list[RowsConfig]]) -> int:
    """Worker: launch every configuration once on uninitialised operands (fills Triton's file cache)."""
    m, t, cfgs = job
    o = operands(m, t, 1, init=False)
    for cfg in cfgs:
        fused_call(m, o, o["weights"][0], cfg)()
    torch.cuda.synchronize()
    return len(cfgs)


def precompile(mats: list[Any]) -> float:
    t0 = time.perf_counter()
    jobs = []
    for m in mats:
        for t in ROWS:
            cfgs = [c for _, c in sweep(m, t)]
            jobs += [(m, t, cfgs[i : i + 4]) for i in range(0, len(cfgs), 4)]
    with mp.get_context("spawn").Pool(WORKERS) as pool:
        pool.map_async(_warm, jobs, chunksize=1).get(timeout=PRECOMPILE_TIMEOUT_S)
    return time.perf_counter() - t0


def bench(m: Any, t: int, copy_gbps: float) -> list[dict[str, Any]]:
    sets = graph_sets(DEV, m.nbytes)
    o = operands(m, t, sets)
    ref = reference(m, o)
    est_us = m.nbytes / 3e3
    calls = max(MIN_CALLS, math.ceil(MIN_GRAPH_US / est_us))
    calls += -calls % sets

    def row(method: str, label: str, cfg: RowsConfig | None, us: float | None, err: float | None) -> dict:
        return dict(
            matrix=m.name, kind=m.kind, n=m.n, k=m.k, T=t, MB=m.nbytes / 1e6, method=method, config=label,
            cfg=None if cfg is None else {f: getattr(cfg, f) for f in RowsConfig.__dataclass_fields__},
            rel_err=err, us=us, pct_copy=100 * m.nbytes / us / 1e3 / copy_gbps if us else None,
        )  # fmt: skip

    x = o["x"]
    rows = [
        row(
            "cublas",
            "F.linear",
            None,
            gemv_tune.graph_time([lambda w=w: F.linear(x, w) for w in o["weights"]], calls, est_us),
            None,
        )
    ]
    for label, cfg in sweep(m, t):
        try:
            err = gemv_tune.rel(fused_call(m, o, o["weights"][0], cfg)(), ref)
            if not err <= 2e-2:
                rows.append(row("fused", label, cfg, None, err) | {"status": "FAIL"})
                continue
            us = gemv_tune.graph_time([fused_call(m, o, w, cfg) for w in o["weights"]], calls, est_us)
            rows.append(row("fused", label, cfg, us, err) | {"status": "ok"})
        except Exception as exc:  # noqa: BLE001 - one broken configuration must not stop the sweep
            rows.append(
                row("fused", label, cfg, None, None) | {"status": f"error: {type(exc).__name__}: {exc}"[:160]}
            )
    del o
    torch.cuda.empty_cache()
    return rows


def best_rows(rows: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """The fastest passing fused row per (kind, N, K, block_m)."""
    best: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        if r["method"] == "fused" and r.get("status") == "ok":
            key = (r["kind"], r["n"], r["k"], r["cfg"]["block_m"])
            if key not in best or r["us"] < best[key]["us"]:
                best[key] = r
    return best


# ------------------------------------------------------------------------------------------- verify


def tree(t: int, vocab: int) -> Tree:
    gen = torch.Generator().manual_seed(t)
    return Tree(torch.randint(0, vocab, (t,), generator=gen), torch.tensor(draft_tree(t, t)))


def verify_rows(best: dict[tuple, dict[str, Any]]) -> list[dict[str, Any]]:
    model = build_model(gdn_1p3b(), DEV, BF16, 0)
    model.set_gdn_backend("triton")
    gen = torch.Generator().manual_seed(1)
    state = model.prefill(torch.randint(0, model.config.vocab_size, (64,), generator=gen))[0]
    dec = StaticDecoder(model, 512, 4, gemv=True)
    dec.load(state)
    dec.set_token(7)
    decode = graph_us([dec.decode_pick], DEV, TIMER, estimate_us=1200.0)
    del dec
    tuned = {k: RowsConfig(**r["cfg"]) for k, r in best.items()}
    rows = []
    for t in (33, 64, 16):
        tr = tree(t, model.config.vocab_size)
        base = None
        for name, fuse, table in (("cuBLAS + glue", False, {}), ("fused, default tiles", True, {}),
                                  ("fused, tuned", True, tuned)):  # fmt: skip
            tlin.TUNED_ROWS.clear()
            tlin.TUNED_ROWS.update(table)
            dec = StaticDecoder(model, 512, 64, gemv=True, fuse_verify=fuse)
            dec.load(state)
            slot = TreeSlot(dec, t, max_depth=int(tr.depth.max()))
            slot.set_tree(tr)
            fn = partial(dec.verify, slot)
            logits = GraphedCall(fn, DEV)().clone()
            base = logits if base is None else base
            us = graph_us([fn], DEV, TIMER, estimate_us=2000.0)
            rows.append(dict(T=t, verify=name, us=us, decode_us=decode, x_decode=us / decode,
                             logits_err_vs_cublas=gemv_tune.rel(logits, base)))  # fmt: skip
            print(f"verify T={t} {name}: {us:.0f} us = {us / decode:.2f} decode steps", flush=True)
            del dec, slot
            torch.cuda.empty_cache()
    tlin.TUNED_ROWS.clear()
    return rows


def markdown(res: dict[str, Any]) -> str:
    fmt = gemv_tune.fmt
    lines = [
        "# Row-tiled (verify) linears vs cuBLAS at GDN-1.3B, H200",
        "",
        f"copy bandwidth {res['copy_GBps']:.0f} GB/s; precompile {res['precompile_s']:.1f} s; total "
        f"{res['elapsed_s']:.0f} s; skipped: {', '.join(res['skipped']) or 'none'}",
        "",
        "| matrix | kind | N x K | T | MB | cuBLAS us | default us | best us | best % copy | best config "
        "| best vs cuBLAS |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|---|--:|",
    ]
    by: dict[tuple, list] = {}
    for r in res["rows"]:
        by.setdefault((r["kind"], r["n"], r["k"], r["T"]), []).append(r)
    for (kind, n, k, t), rs in by.items():
        get = {r["config"]: r for r in rs}
        ok = [r for r in rs if r["method"] == "fused" and r.get("status") == "ok"]
        b = min(ok, key=lambda r: r["us"]) if ok else None
        cub = get["F.linear"]["us"]
        lines.append(
            f"| {rs[0]['matrix']} | {kind} | {n} x {k} | {t} | {rs[0]['MB']:.1f} | {fmt(cub)} | "
            f"{fmt(get.get('default', {}).get('us'))} | {fmt(b and b['us'])} | "
            f"{fmt(b and b['pct_copy'], '.0f')} | "
            f"{b['config'] if b else '-'} | {fmt(cub / b['us'] if b else None, '.2f')}x |"
        )
    lines += [
        "",
        "## gdn-1.3b verify (CUDA graph medians)",
        "",
        "| T | linears | us | decode us | x decode | logits err vs cuBLAS |",
        "|--:|---|--:|--:|--:|--:|",
    ]
    for r in res["verify"]:
        lines.append(f"| {r['T']} | {r['verify']} | {r['us']:.0f} | {r['decode_us']:.0f} | "
                     f"{r['x_decode']:.2f} | "
                     f"{r['logits_err_vs_cublas']:.1e} |")  # fmt: skip
    lines += ["", "TUNED_ROWS entries (repro/gdn/triton_linear.py):", "", "```python"]
    for b in res["best"]:
        c = b["cfg"]
        fields = ", ".join(str(c[f]) for f in RowsConfig.__dataclass_fields__)
        lines.append(
            f'("{b["kind"]}", {b["n"]}, {b["k"]}, {c["block_m"]}): RowsConfig({fields}),  # gdn-1.3b '
            f"{b['matrix']} T={b['T']}: {b['us']:.1f} us, {b['pct_copy']:.0f}% of copy"
        )
    lines += ["```", "", "Every configuration (us):", ""]
    for (kind, n, k, t), rs in by.items():
        cells = ", ".join(
            f"{r['config']} {fmt(r['us'])}" + ("" if r.get("status", "ok") == "ok" else " " + r["status"])
            for r in rs
        )
        lines.append(f"- {kind} {n}x{k} T={t}: {cells}")
    return "\n".join(lines) + "\n"


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "rows-tune-out")
    out.mkdir(parents=True, exist_ok=True)
    mats = matrices()
    try:
        pre_s = precompile(mats)
    except Exception as exc:  # noqa: BLE001 - the rest compiles on first launch
        pre_s = math.nan
        print(f"precompile stopped: {type(exc).__name__}: {exc}", flush=True)
    print(f"precompiled in {pre_s:.1f} s", flush=True)
    copy_gbps = float(measure_ceilings(DEV, TimerConfig(warmup_ms=5, rep_ms=20))["copy_GBps"])
    rows, skipped = [], []
    for t in ROWS:
        for m in mats:
            if time.perf_counter() - START > BUDGET_S:
                skipped.append(f"{m.name} T={t}")
                continue
            rows += bench(m, t, copy_gbps)
            print(f"{m.name} T={t}: {time.perf_counter() - START:.0f} s", flush=True)
    best = best_rows(rows)
    res: dict[str, Any] = dict(device=torch.cuda.get_device_name(), copy_GBps=copy_gbps, precompile_s=pre_s,
                               rows=rows, skipped=skipped, best=list(best.values()))  # fmt: skip
    (out / "rows-tune.json").write_text(json.dumps(res, indent=1, default=str))
    res["verify"] = verify_rows(best)
    res["elapsed_s"] = time.perf_counter() - START
    (out / "rows-tune.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res)
    (out / "rows-tune.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
