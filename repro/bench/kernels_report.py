"""A `repro bench kernels` run's records as a table and a report: the record columns, report.md (the
environment and ceilings, the kernel targets judged, a table per shape and row group, the rows not timed,
the notes, the definitions), table.csv and the figures, and the run kind. Nothing here measures
(:mod:`repro.bench.kernels` does, and fills the derived columns x_floor, speedup and the paper ones into
each record as the run goes)."""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path
from typing import Any

import pandas as pd

from repro.bench.kernel_targets import target_lines
from repro.bench.shapes import SHAPES
from repro.bench.timing import counts_line
from repro.reporting.rundir import Run, RunKind, fields_parser

COLUMNS = [
    "shape", "group", "kind", "T", "depth", "leaves", "flat_len", "method", "dtype", "precision", "status",
    "reason", "rel_err", "tol", "us", "us_graph", "graph_sets", "floor_us", "floor_bound", "x_floor",
    "x_floor_graph", "baseline", "speedup", "speedup_graph", "paper_us", "paper_speedup", "paper_ref",
    "prior_us", "bytes_min", "flops", "timer", "seed",
]  # fmt: skip
COUNTS = ["n_timed", "graph_replays", "graph_calls"]  # what us and us_graph are medians of
PARTS = ["phase1_us_graph"]  # a two-launch form's first launch alone (CUDA graphs): in newer runs only


def build_report(run: Run, figures_dir: Path | None) -> str:
    """table.csv, figures (in ``figures_dir``) and report.md of a bench-kernels run, from its records."""
    present = {k for r in run.records for k in r}  # the timing counts and parts: only in runs of newer code
    table = pd.DataFrame(run.records, columns=COLUMNS + [c for c in COUNTS + PARTS if c in present])
    run.write("table.csv", table.to_csv(index=False))
    figs = write_figures(table, figures_dir) if figures_dir is not None else {}
    text = report_markdown(
        table, run.manifest, run.path, {k: os.path.relpath(v, run.path) for k, v in figs.items()}
    )
    run.write("report.md", text)
    return text


# ----------------------------------------------------------------------------- report, figures

REPORT_COLUMNS = [
    "kind", "T", "depth", "leaves", "method", "dtype", "precision", "status", "rel_err", "us", "us_graph",
    "floor_us", "x_floor_graph", "x_floor", "speedup", "speedup_graph", "paper_us", "paper_speedup",
    "prior_us",
]  # fmt: skip
FORMATS = {
    "rel_err": "{:.1e}", "us": "{:.1f}", "us_graph": "{:.1f}", "floor_us": "{:.2f}", "x_floor": "{:.1f}",
    "x_floor_graph": "{:.1f}", "speedup_graph": "{:.2f}x", "paper_us": "{:.1f}", "prior_us": "{:g}",
}  # fmt: skip


def report_markdown(
    table: pd.DataFrame, manifest: dict[str, Any], out_dir: Path, figures: dict[str, str]
) -> str:
    """report.md's text: environment, ceilings, the kernel targets of issues 13 and 10
    (:mod:`repro.bench.kernel_targets`), a table per (shape, group), rows not timed, the cost model."""
    from repro.reporting.report import markdown_table

    c = manifest.get("ceilings", {})
    lines = [
        f"# Kernel benchmarks: {out_dir.name}",
        "",
        f"- device: {manifest.get('bench_device')} ({manifest.get('device')})",
        f"- git sha: {manifest.get('git_sha')}; versions: "
        + ", ".join(f"{k} {v}" for k, v in manifest.get("versions", {}).items()),
        f"- timer: {c.get('timer')}; measured copy bandwidth {c.get('copy_GBps', math.nan):.0f} GB/s"
        f" (read + write), matmul bf16 {c.get('bf16_TFLOPs', math.nan):.1f} TFLOP/s,"
        f" fp32 {c.get('fp32_TFLOPs', math.nan):.2f} TFLOP/s",
        f"- {len(table)} rows: " + ", ".join(f"{k} {v}" for k, v in table["status"].value_counts().items()),
        "",
    ]
    lines += target_lines(table)
    titles = {
        "verify": "Verification (us per layer call)",
        "recovery": "Accepted-state recovery (depth = accepted)",
        "step": "Commit the previous path + verify the tree (depth = previous accepted)",
        "chain": "Chain verification (T = chain length; chain_verify = repro.gdn.chain's choice)",
    }
    for shape, group in itertools.product(dict.fromkeys(table["shape"]), titles):
        part = table[(table["shape"] == shape) & (table["group"] == group)]
        if part.empty:
            continue
        sh = SHAPES[shape]
        lines += [f"## {shape} (H={sh.h}, HV={sh.hv}, dk={sh.dk}, dv={sh.dv}): {titles[group]}", ""]
        lines += [markdown_table(part[REPORT_COLUMNS].reset_index(drop=True), FORMATS), ""]
        if counts := counts_line(part.to_dict("records")):
            lines += [counts, ""]
    for name, path in figures.items():
        lines += [f"![{name}]({path})", ""]
    untimed = table[table["status"] != "ok"]
    if len(untimed):
        lines += ["## Rows not timed", ""]
        for r in untimed[untimed["status"] != "skipped"].itertuples():
            where = f"depth={r.depth}" if r.group in ("recovery", "step") else r.kind
            lines.append(f"- {r.status}: {r.shape} {where} T={r.T} {r.method} ({r.dtype}): {r.reason}")
        for reason, part in untimed[untimed["status"] == "skipped"].groupby("reason", sort=False):
            methods = ", ".join(dict.fromkeys(part["method"]))
            lines.append(f"- skipped ({reason}): {len(part)} rows of {methods}")
        lines.append("")
    notes = table[(table["status"] == "ok") & (table["reason"].fillna("") != "")]
    if len(notes):
        lines += ["## Notes", ""]
        lines += sorted({f"- {r.method}: {r.reason}" for r in notes.itertuples()})
        lines.append("")
    lines += ["## Definitions", "", DEFINITIONS, ""]
    return "\n".join(lines)


DEFINITIONS = """\
- us: median of triton do_bench (device events around each call, L2 flushed before each);
  us_graph: median over replays of one CUDA graph cycling through graph_sets input sets (so that
  one cycle moves at least 3x the L2), per call. CPU runs: a perf_counter loop (plumbing only).
- rel_err: ‖out - ref‖ / ‖ref‖ against the float64 reference (repro.gdn.reference) on the same
  inputs; tolerance 1e-2 for bf16 q/k/v, 1e-4 for fp32; a row over it is FAIL and not timed.
- precision (tree_fused): the Triton kernel's float32 dot mode; bf16 rows use --bf16-precision
  (default tf32), fp32 rows "ieee".
- floor_us = max(bytes_min / measured copy bandwidth, flops / measured matmul rate of the method's
  arithmetic); counts: repro/bench/kernel_methods.py module docstring. x_floor_graph = us_graph / floor_us
  (the CUDA-graph time, the one to read; "-" where no graph was timed, e.g. CPU runs); x_floor =
  us / floor_us (the do_bench time per call, which at these sizes includes the launch and host overhead
  that the graph removes).
- speedup: the block's baseline us / this row's us; speedup_graph: the same with us_graph (verification:
  per_branch_recurrent on the same tree; recovery: commit_replay_fla on the same accepted path, and for the
  *_conv rows, which commit the conv history too, commit_replay_fla_conv (the same replay plus the
  project's conv-history commit kernel); step:
  step_replay_fla, same tree and depth; chain: per_branch_recurrent, fla's recurrence over the same chain).
- per-branch and prefill baselines get their flattened, per-path inputs and S0 copies prepared
  outside the timing (in their favour); recovery factors and snapshots are made outside the timing.
- paper_us / paper_speedup: the papers' numbers (their GPUs: Weaver B200, SpecLA H100); prior_us:
  stock fla kernels measured earlier on the project's H200 (baselines/related.yaml, another tree)."""


def _log2_ticks(ax: Any, values: pd.Series) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted({int(v) for v in values.dropna()})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()


def write_figures(table: pd.DataFrame, folder: Path) -> dict[str, Path]:
    """kernel_tree_vs_branch.png (verification us vs T on draft trees, paper B200 points), recovery.png and
    chain.png (chain verification us vs T)."""
    from matplotlib.figure import Figure

    from repro.reporting.figures import save_png

    ok = table[table["status"] == "ok"]
    out: dict[str, Path] = {}
    shapes = list(dict.fromkeys(table["shape"]))
    verify = ok[(ok["group"] == "verify") & (ok["kind"] == "draft")]
    if len(verify):
        fig = Figure(figsize=(5.5 * len(shapes), 4.4), layout="constrained")
        for ax, shape in zip(fig.subplots(1, len(shapes), squeeze=False)[0], shapes):
            part = verify[verify["shape"] == shape]
            colors: dict[str, str] = {}
            for (method, dtype), g in part.groupby(["method", "dtype"], sort=False):
                g = g.sort_values("T")
                main = method in ("tree_fused", "per_branch_recurrent") and dtype == "bf16"
                style = dict(marker="o", lw=2 if main else 1, alpha=1 if main else 0.6)
                line = ax.plot(g["T"], g["us"], label=f"{method} ({dtype})", **style)[0]
                colors.setdefault(method, line.get_color())
                if g["us_graph"].notna().any():
                    ax.plot(g["T"], g["us_graph"], ls="--", color=line.get_color(), alpha=0.6)
            mine = table[
                (table["shape"] == shape) & (table["group"] == "verify") & (table["kind"] == "draft")
            ]
            for method, g in mine[mine["paper_us"].notna()].groupby("method", sort=False):
                ax.plot(g["T"], g["paper_us"], ls="none", marker="*", ms=12, color=colors.get(method),
                        label=f"paper (B200): {method}")  # fmt: skip
            _log2_ticks(ax, mine["T"])
            ax.set_yscale("log")
            ax.set_xlabel("tree nodes T")
            ax.set_ylabel("us per layer (dashed: CUDA graph)")
            ax.set_title(f"{shape}: tree verification")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize="x-small")
        out["tree vs per-branch verification"] = save_png(fig, folder / "kernel_tree_vs_branch.png")
    rec = ok[ok["group"] == "recovery"]
    if len(rec):
        fig = Figure(figsize=(5.5 * len(shapes), 4.4), layout="constrained")
        for ax, shape in zip(fig.subplots(1, len(shapes), squeeze=False)[0], shapes):
            for method, g in rec[rec["shape"] == shape].groupby("method", sort=False):
                g = g.sort_values("depth")
                line = ax.plot(g["depth"], g["us"], marker="o", label=method)[0]
                if g["us_graph"].notna().any():
                    ax.plot(g["depth"], g["us_graph"], ls="--", color=line.get_color(), alpha=0.6)
            _log2_ticks(ax, rec["depth"])
            ax.set_xlabel("accepted depth")
            ax.set_ylabel("us per layer (dashed: CUDA graph)")
            ax.set_title(f"{shape}: accepted-state recovery")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize="small")
        out["accepted-state recovery"] = save_png(fig, folder / "recovery.png")
    chains = ok[ok["group"] == "chain"]
    if len(chains):
        fig = Figure(figsize=(5.5 * len(shapes), 4.4), layout="constrained")
        for ax, shape in zip(fig.subplots(1, len(shapes), squeeze=False)[0], shapes):
            mine = chains[chains["shape"] == shape]
            for (method, dtype), g in mine.groupby(["method", "dtype"], sort=False):
                g = g.sort_values("T")
                times = g["us_graph"].fillna(g["us"])  # graph-timed where the method was captured
                ax.plot(g["T"], times, marker="o", lw=2 if method == "chain_verify" else 1,
                        label=f"{method} ({dtype})")  # fmt: skip
            _log2_ticks(ax, chains["T"])
            ax.set_yscale("log")
            ax.set_xlabel("chain length T")
            ax.set_ylabel("us per layer (CUDA graph where timed)")
            ax.set_title(f"{shape}: chain verification")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize="small")
        out["chain verification"] = save_png(fig, folder / "chain.png")
    return out


KIND = RunKind(
    "bench-kernels",
    fields_parser("shape", "group", "kind", "T", "method", "dtype", "status"),
    build_report,
    ("report.md", "table.csv"),
)
