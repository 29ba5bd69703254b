"""Launch configurations of the GEMV kernels (repro.gdn.triton_linear) per decode matrix, on the H200.

    python3 scripts/gpu/gemv-tune.py OUT_DIR      (one H200: < 90 s)

1. every distinct decode matrix of the gdn-1.3b shape, then the qwen3.6-27b shape's (shapes read off
   StaticDecoder's stacked weights of a model built on the meta device: GDN in_proj with its input norm,
   out_proj + residual, attention q|k|v and o_proj, norm + gate|up + SiLU * up, down + residual, final
   norm + LM head + argmax), bf16 random weights: cuBLAS (``F.linear`` on [1, K]) against the fused
   kernel at the legacy configuration, the heuristic and a bounded sweep (~14 a matrix: block_n x block_k
   tiles of 4096 .. 16384 weights on 4 / 8 / 16 warps, the heuristic with 3 stages, split-K 2 / 4 where
   the output is narrow): each checked
   against the torch composition in float32 (not timed past 2e-2), then timed as one CUDA graph of >= 16
   calls cycling through enough weight copies to move 3x the L2 per cycle; us, GB/s, % of the measured
   copy bandwidth, the best configuration. 27B matrices not started by BUDGET_S are skipped (listed).
2. the gdn-1.3b decode step (random bf16 weights, from the empty state, a CUDA graph of 50 steps of
   ``decode_pick``, median per step): cuBLAS matmuls (gemv=False) vs gemv=True with the legacy
   configurations, the heuristic and the best ones found in 1 (``gemv_configs`` active at capture);
   floor = weights once at the copy bandwidth; logits of each vs the cuBLAS step.

The kernels of every (matrix, configuration) are compiled first in worker processes that share Triton's
file cache (the sweep is ~110 distinct compiles; one process would take most of the budget).

Writes OUT_DIR/gemv-tune.json (rows, best configurations per shape as GemvConfig fields, the decode
rows) and OUT_DIR/gemv-tune.md; prints the markdown and the table lines to paste into ``TUNED``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.kernels import graph_sets  # noqa: E402
from repro.bench.model import MODEL_SHAPES, build_model, weight_bytes  # noqa: E402
from repro.bench.timing import TimerConfig, graph_us, measure_ceilings  # noqa: E402
from repro.gdn import triton_linear as tlin  # noqa: E402
from repro.gdn.triton_linear import GemvConfig  # noqa: E402
from repro.models.config import GDN, HybridConfig  # noqa: E402
from repro.models.hybrid import HybridLM  # noqa: E402
from repro.models.layers import rms_norm  # noqa: E402
from repro.models.static import StaticDecoder  # noqa: E402
from repro.models.static_layers import AttentionWeights, GDNWeights  # noqa: E402

SHAPES = ("gdn-1.3b", "qwen3.6-27b")
START = time.perf_counter()
BUDGET_S = 60.0  # matrices not started by then are skipped; the decode rows (~15 s) follow
MIN_CALLS, MIN_GRAPH_US = 16, 300.0  # calls per graph: >= 16 and >= 300 us of work per replay
REPLAYS = 7
WORKERS = max(1, min(14, (os.cpu_count() or 2) - 2))
PRECOMPILE_TIMEOUT_S = 45.0  # past it the workers are stopped and the rest compiles on first launch
BF16 = torch.bfloat16


@dataclass(frozen=True)
class Matrix:
    """One decode matmul: its kernel, output columns n (I for gate|up) and K."""

    shape: str
    name: str
    kind: str
    n: int
    k: int

    @property
    def rows(self) -> int:  # weight rows
        return 2 * self.n if self.kind == "norm_gate_up" else self.n

    @property
    def nbytes(self) -> int:
        return self.rows * self.k * 2

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.n}x{self.k}"


def decode_matrices(shape: str, config: HybridConfig | None = None) -> list[Matrix]:
    """The distinct decode matmuls of a model shape (``config``, else :data:`MODEL_SHAPES`' of that name),
    read off StaticDecoder's stacked weights (meta)."""
    torch.set_default_dtype(BF16)
    try:
        with torch.device("meta"):
            model = HybridLM(config or MODEL_SHAPES[shape]())
    finally:
        torch.set_default_dtype(torch.float32)
    out: dict[tuple[str, int, int], Matrix] = {}

    def add(name: str, kind: str, n: int, k: int) -> None:
        out.setdefault((kind, n, k), Matrix(shape, name, kind, n, k))

    for layer in model.model.layers:
        if layer.layer_type == GDN:
            w = GDNWeights.of(layer, BF16, True)
            add("gdn in_proj", "norm_linear", *w.in_proj.shape)
            add("gdn out_proj", "linear_residual", *layer.linear_attn.out_proj.weight.shape)
        else:
            a = AttentionWeights.of(layer, True)
            add("attn q|k|v", "norm_linear", *a.qkv.shape)
            add("attn o_proj", "linear_residual", *layer.self_attn.o_proj.weight.shape)
        add(
            "gate|up",
            "norm_gate_up",
            layer.mlp.gate_proj.weight.shape[0],
            layer.mlp.gate_proj.weight.shape[1],
        )
        add("down", "linear_residual", *layer.mlp.down_proj.weight.shape)
    add("lm_head", "norm_linear_argmax", *model.lm_head.weight.shape)
    return list(out.values())


# (weights per K step across both tiles of gate|up, block_k, warps): 32 weights a thread (four 16-byte
# loads) at 4096 / 8192 / 16384 on 4 / 8 / 16 warps, 16 a thread (more warps resident) and 64 a thread
GRID = [(4096, bk, 4) for bk in (512, 1024, 2048)] + [(8192, bk, 8) for bk in (256, 512, 1024, 2048)]
GRID += [(16384, 1024, 16), (16384, 2048, 16), (4096, 1024, 8), (8192, 1024, 16), (16384, 1024, 8)]


def sweep(m: Matrix) -> list[tuple[str, GemvConfig]]:
    """legacy, the heuristic, GRID (~12), the heuristic with 3 stages, split-K 2 and 4 where fewer than
    ~2 programs per SM would run at block_n 16: about 16 distinct configurations."""
    width = 2 if m.kind == "norm_gate_up" else 1
    heur = tlin.heuristic_config(
        m.kind, m.n, m.k, 1, torch.cuda.get_device_properties(0).multi_processor_count
    )
    out = [("legacy", tlin.legacy_config(m.n, m.k)), ("heuristic", heur)]
    for tile, bk, warps in GRID:
        bn = tile // (bk * width)
        if 1 <= bn <= 64 and bk <= 2 * m.k:
            out.append((f"{bn}x{bk} w{warps}", GemvConfig(bn, bk, warps)))
    out.append(("heuristic s3", dataclasses.replace(heur, num_stages=3)))
    if m.n // 16 < 2 * 132:
        out += [(f"{16 // width}x512 split{s}", GemvConfig(16 // width, 512, 8, 1, s)) for s in (2, 4)]
    seen, unique = set(), []
    for i, (label, cfg) in enumerate(out):
        if cfg not in seen or i < 2:  # legacy and heuristic keep their rows even when equal
            seen.add(cfg)
            unique.append((label, cfg))
    return unique


# ------------------------------------------------------------------------------------------- calls


@dataclass
class Operands:
    """One matrix's weight copies and the row, norm scale, residual and pick every call reads."""

    weights: list[torch.Tensor]
    x: torch.Tensor
    scale: torch.Tensor
    residual: torch.Tensor
    pick: torch.Tensor


def operands(m: Matrix, sets: int, init: bool = True, rows: int = 1) -> Operands:
    """``sets`` weight copies and ``rows`` rows of x (and of the residual); random, or uninitialised."""
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape: int, s: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        if not init:
            return torch.empty(*shape, dtype=BF16, device="cuda")
        return (shift + s * torch.randn(*shape, generator=gen, device="cuda")).to(BF16)

    weights = [rnd(m.rows, m.k, s=m.k**-0.5) for _ in range(sets)]
    pick = torch.zeros(1, dtype=torch.long, device="cuda")
    return Operands(weights, rnd(rows, m.k, s=3.0), rnd(m.k, s=0.2, shift=1.0), rnd(rows, m.n), pick)


def fused_call(m: Matrix, o: Operands, w: torch.Tensor, cfg: GemvConfig) -> Callable[[], torch.Tensor]:
    blocks = cfg.as_dict()
    if m.kind == "norm_linear":
        return lambda: tlin.norm_linear(o.x, o.scale, 1e-6, w, **blocks)
    if m.kind == "norm_gate_up":
        return lambda: tlin.norm_gate_up(o.x, o.scale, 1e-6, w, **blocks)
    if m.kind == "linear_residual":
        return lambda: tlin.linear_residual(o.x, w, o.residual, **blocks)
    return lambda: tlin.norm_linear_argmax(o.x, o.scale, 1e-6, w, None, o.pick, **blocks)


def reference(m: Matrix, o: Operands) -> torch.Tensor:
    """The torch composition in float32 on the first weight copy."""
    x, w = o.x.float(), o.weights[0].float()
    if m.kind == "linear_residual":
        return o.residual.float() + F.linear(x, w)
    y = F.linear(rms_norm(x, o.scale.float(), 1e-6), w)
    return F.silu(y[:, : m.n]) * y[:, m.n :] if m.kind == "norm_gate_up" else y


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300)) if bool(torch.isfinite(a).all()) else math.inf


def graph_time(fns: list[Callable[[], Any]], calls: int, est_us: float) -> float:
    """Median us per call over replays of one CUDA graph of ``calls`` calls cycling through ``fns``
    (:func:`repro.bench.timing.graph_us`, its call count pinned to ``calls``)."""
    cfg = TimerConfig(warmup_ms=0.0, rep_ms=(calls + 0.5) * est_us / 1e3, graph_replays=REPLAYS)
    return graph_us(fns, torch.device("cuda"), cfg, est_us)


# ---------------------------------------------------------------------------------- compile workers


def _warm(job: tuple[Matrix, list[GemvConfig]]) -> int:
    """Worker: launch every configuration once on uninitialised operands (fills Triton's file cache)."""
    m, cfgs = job
    o = operands(m, 1, init=False)
    for cfg in cfgs:
        fused_call(m, o, o.weights[0], cfg)()
    torch.cuda.synchronize()
    return len(cfgs)


def precompile(matrices: list[Matrix]) -> float:
    """Compile every (matrix, configuration) kernel in WORKERS spawned processes; seconds taken."""
    t0 = time.perf_counter()
    jobs = []
    for m in matrices:
        cfgs = [c for _, c in sweep(m)]
        jobs += [(m, cfgs[i : i + 3]) for i in range(0, len(cfgs), 3)]
    with mp.get_context("spawn").Pool(WORKERS) as pool:  # leaving the block terminates the workers
        pool.map_async(_warm, jobs, chunksize=1).get(timeout=PRECOMPILE_TIMEOUT_S)
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------ matrices


def bench_matrix(m: Matrix, copy_gbps: float) -> list[dict[str, Any]]:
    sets = graph_sets(torch.device("cuda"), m.nbytes)
    o = operands(m, sets)
    ref = reference(m, o)
    est_us = m.nbytes / 3e3  # ~3 TB/s
    calls = max(MIN_CALLS, math.ceil(MIN_GRAPH_US / est_us))
    calls += -calls % sets

    def row(method: str, label: str, cfg: GemvConfig | None, us: float | None, err: float | None) -> dict:
        return dict(
            shape=m.shape, matrix=m.name, kind=m.kind, n=m.n, k=m.k, MB=m.nbytes / 1e6, method=method,
            config=label, cfg=cfg.as_dict() if cfg else None, rel_err=err, us=us,
            GBps=m.nbytes / us / 1e3 if us else None,
            pct_copy=100 * m.nbytes / us / 1e3 / copy_gbps if us else None,
            sets=sets, calls=calls,
        )  # fmt: skip

    x = o.x
    cublas = graph_time([lambda w=w: F.linear(x, w) for w in o.weights], calls, est_us)
    rows = [row("cublas", "F.linear", None, cublas, None)]
    for label, cfg in sweep(m):
        try:
            y = fused_call(m, o, o.weights[0], cfg)()
            err = rel(y, ref)
            if m.kind == "norm_linear_argmax" and int(o.pick[0]) != int(y[0].float().argmax()):
                err = math.inf  # the pick is not the first largest logit
            if not err <= 2e-2:
                rows.append(row("fused", label, cfg, None, err) | {"status": "FAIL"})
                continue
            us = graph_time([fused_call(m, o, w, cfg) for w in o.weights], calls, est_us)
            rows.append(row("fused", label, cfg, us, err) | {"status": "ok"})
        except Exception as exc:  # noqa: BLE001 - one broken configuration must not stop the sweep
            rows.append(
                row("fused", label, cfg, None, None) | {"status": f"error: {type(exc).__name__}: {exc}"[:200]}
            )
    del o
    torch.cuda.empty_cache()
    return rows


def best_rows(rows: list[dict[str, Any]], per_rows: bool = False) -> dict[str, dict[str, Any]]:
    """The fastest passing fused row per (shape, matrix key), and row count of x with ``per_rows``."""
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["method"] == "fused" and r.get("status") == "ok":
            key = f"{r['shape']}:{r['kind']}/{r['n']}x{r['k']}" + (f"/n{r['rows']}" if per_rows else "")
            if key not in best or r["us"] < best[key]["us"]:
                best[key] = r
    return best


# ------------------------------------------------------------------------------------- decode step


def step_us(dec: StaticDecoder, state, table: Any, reps: int = 50) -> tuple[float, torch.Tensor]:  # noqa: ANN001
    """Median us per decode step over replays of one graph of ``reps`` steps captured with ``table``
    active (``state`` loaded before each); and the first step's logits."""
    with tlin.gemv_configs(table):
        dec.load(state)
        dec.set_token(7)
        first = dec.decode_pick().clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            dec.decode_pick()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                dec.decode_pick()
    times = []
    for _ in range(REPLAYS):
        dec.load(state)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(1e3 * start.elapsed_time(end) / reps)
    return statistics.median(times), first


def decode_rows(best: dict[str, dict[str, Any]], copy_gbps: float) -> list[dict[str, Any]]:
    model = build_model(MODEL_SHAPES["gdn-1.3b"](), torch.device("cuda"), BF16, 0)
    model.set_gdn_backend("triton")
    state = None  # every step starts from the empty state (no prefill: no fla kernels to compile)
    floor = weight_bytes(model) / (copy_gbps * 1e3)
    tuned = {
        (r["kind"], r["n"], r["k"]): GemvConfig(**r["cfg"]) for r in best.values() if r["shape"] == "gdn-1.3b"
    }
    rows, base = [], None
    for name, gemv, table in (
        ("cublas", False, "heuristic"), ("gemv legacy", True, "legacy"),
        ("gemv heuristic", True, "heuristic"), ("gemv best of sweep", True, tuned),
    ):  # fmt: skip
        dec = StaticDecoder(model, 1024, 4, gemv=gemv)
        state = dec.export() if state is None else state
        us, first = step_us(dec, state, table)
        base = first if base is None else base
        rows.append(
            dict(
                shape="gdn-1.3b", matmuls=name, us=us, floor_us=floor, floor_frac=floor / us,
                logits_err_vs_cublas=rel(first, base), tuned_entries=len(tuned) if table is tuned else None,
            )
        )  # fmt: skip
        del dec
        torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------------------------------- report


def fmt(v: Any, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "# GEMV launch configurations (triton_linear) vs cuBLAS, H200",
        "",
        f"copy bandwidth {res['copy_GBps']:.0f} GB/s; precompile {res['precompile_s']:.1f} s with {WORKERS}"
        f" workers; total {res['elapsed_s']:.1f} s; skipped: {', '.join(res['skipped']) or 'none'}",
        "",
        "| shape | matrix | kind | N x K | MB | cuBLAS us | legacy us | heuristic us | best us | best GB/s |"
        " best % copy | best config | best vs cuBLAS |",
        "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|--:|",
    ]
    by = {}
    for r in res["rows"]:
        by.setdefault((r["shape"], r["kind"], r["n"], r["k"]), []).append(r)
    for (shape, kind, n, k), rs in by.items():
        get = {r["config"]: r for r in rs}
        b = res["best"].get(f"{shape}:{kind}/{n}x{k}")
        cub = get["F.linear"]["us"]
        lines.append(
            f"| {shape} | {rs[0]['matrix']} | {kind} | {n} x {k} | {rs[0]['MB']:.1f} | {fmt(cub)} | "
            f"{fmt(get.get('legacy', {}).get('us'))} | {fmt(get.get('heuristic', {}).get('us'))} | "
            f"{fmt(b and b['us'])} | {fmt(b and b['GBps'], '.0f')} | {fmt(b and b['pct_copy'], '.0f')} | "
            f"{b['config'] if b else '-'} {json.dumps(b['cfg']) if b else ''} | "
            f"{fmt(cub / b['us'] if b and cub else None, '.2f')}x |"
        )
    lines += ["", "Every configuration (us; FAIL / error rows not timed):", ""]
    for (shape, kind, n, k), rs in by.items():
        cells = ", ".join(
            f"{r['config']} {fmt(r['us'])}" + ("" if r.get("status", "ok") == "ok" else f" {r['status']}")
            for r in rs
        )
        lines.append(f"- {shape} {kind} {n}x{k}: {cells}")
    lines += [
        "",
        "## gdn-1.3b decode step (CUDA graph of 50 steps)",
        "",
        "| matmuls | us/step | floor us | % of floor | logits err vs cuBLAS |",
        "|---|--:|--:|--:|--:|",
    ]
    for r in res["decode"]:
        lines.append(
            f"| {r['matmuls']} | {r['us']:.0f} | {r['floor_us']:.0f} | {100 * r['floor_frac']:.0f}% | "
            f"{r['logits_err_vs_cublas']:.1e} |"
        )
    lines += table_entries(res["best"], "TUNED entries (repro/gdn/triton_linear.py):",
                           lambda b: f'("{b["kind"]}", {b["n"]}, {b["k"]}): GemvConfig')  # fmt: skip
    return "\n".join(lines)


def table_entries(
    best: dict[str, dict[str, Any]], title: str, head: Callable[[dict[str, Any]], str]
) -> list[str]:
    """Markdown lines: ``title`` and a python block of one table entry per best row (``head(row)``, then the
    row's configuration fields in parentheses, then its shape, matrix, time and share of copy bandwidth)."""
    lines = ["", title, "", "```python"]
    for key, b in best.items():
        cfg = ", ".join(str(v) for v in b["cfg"].values())
        what = f"{key.split(':')[0]} {b['matrix']}: {b['us']:.1f} us, {b['pct_copy']:.0f}% of copy"
        lines.append(f"{head(b)}({cfg}),  # {what}")
    return lines + ["```"]


def main() -> None:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "gemv-tune-out")
    out_dir.mkdir(parents=True, exist_ok=True)
    matrices = [m for shape in SHAPES for m in decode_matrices(shape)]
    try:
        pre_s = precompile(matrices)
        print(f"precompiled {len(matrices)} matrices' sweeps in {pre_s:.1f} s", flush=True)
    except Exception as exc:  # noqa: BLE001 - the kernels then compile one by one in this process
        pre_s = math.nan
        print(f"precompile failed ({type(exc).__name__}: {exc}); compiling in this process", flush=True)
    ceil = measure_ceilings(torch.device("cuda"), TimerConfig(warmup_ms=5, rep_ms=20))
    copy_gbps = float(ceil["copy_GBps"])
    rows, skipped = [], []
    for m in matrices:
        if m.shape != "gdn-1.3b" and time.perf_counter() - START > BUDGET_S:
            skipped.append(f"{m.shape} {m.name}")
            continue
        rows += bench_matrix(m, copy_gbps)
        print(f"{time.perf_counter() - START:5.1f} s  {m.shape} {m.name} {m.key}", flush=True)
    best = best_rows(rows)
    res: dict[str, Any] = dict(
        device=torch.cuda.get_device_name(), copy_GBps=copy_gbps, precompile_s=pre_s, skipped=skipped,
        rows=rows, best=best,
        best_configs={k: v["cfg"] for k, v in best.items()},
    )  # fmt: skip
    res["decode"] = decode_rows(best, copy_gbps)
    res["elapsed_s"] = time.perf_counter() - START
    md = markdown(res)
    (out_dir / "gemv-tune.json").write_text(json.dumps(res, indent=1, default=str))
    (out_dir / "gemv-tune.md").write_text(md + "\n")
    print(md)
    print(json.dumps(res["best_configs"], indent=1))


if __name__ == "__main__":
    main()
