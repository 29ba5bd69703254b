"""A `repro bench model` run's records as a table and a report: the record columns, x_decode derived,
issue 13's targets met or missed, where the time goes, report.md, table.csv and the figure. Nothing here
measures (:mod:`repro.bench.model` does)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pandas as pd

from repro.bench.timing import counts_line
from repro.reporting.rundir import Run, RunKind, fields_parser

TARGET_RATIO = 1.2  # verify(step_nodes) <= 1.2x the decode step at gdn-1.3b (issue 13)
TARGET_FLOOR = {"gdn-1.3b": 0.80, "qwen3.6-27b": 0.88}  # AR decode's share of the floor (issue 13)

COLUMNS = [
    "shape", "group", "method", "T", "accepted", "dtype", "status", "reason", "rel_err", "state_err",
    "rel_err_eager", "top1", "tol", "us", "tokens_per_s", "floor_us", "floor_frac", "x_decode", "layers_gdn",
    "layers_attn", "kernels", "kernel_busy_us", "kernels_by_group", "aten_ops", "bytes_min", "flops",
    "context", "timer", "seed", "n_timed",
]  # fmt: skip


def derive(rows: list[dict[str, Any]]) -> None:
    """x_decode: each row's us over the same shape's decode graph (else eager) us."""
    for shape in {r["shape"] for r in rows}:
        mine = [r for r in rows if r["shape"] == shape]
        base = next(
            (r["us"] for m in ("static_graph", "static_eager") for r in mine
             if r["group"] == "decode" and r["method"] == m and r["us"]),
            None,
        )  # fmt: skip
        for r in mine:
            r["x_decode"] = r["us"] / base if base and r["us"] else None


def build_report(run: Run, figures_dir: Path | None) -> str:
    """table.csv, the figure (in ``figures_dir``) and report.md of a bench-model run, from its records
    (x_decode is derived again over all rows)."""
    rows = [dict(r) for r in run.records]
    derive(rows)
    table = pd.DataFrame(rows, columns=COLUMNS)
    present = {k for r in rows for k in r}  # the table of a run of older code has only its columns
    run.write("table.csv", table[[c for c in COLUMNS if c in present or not rows]].to_csv(index=False))
    figs = write_figure(table, figures_dir) if figures_dir is not None else {}
    text = report_markdown(
        table, run.manifest, run.path, {k: os.path.relpath(v, run.path) for k, v in figs.items()}
    )
    run.write("report.md", text)
    return text


REPORT_COLUMNS = [
    "method", "T", "accepted", "status", "rel_err", "state_err", "rel_err_eager", "top1", "us",
    "tokens_per_s", "floor_us", "floor_frac", "x_decode", "layers_gdn", "layers_attn", "kernels", "aten_ops",
]  # fmt: skip
FORMATS = {
    "rel_err": "{:.1e}", "state_err": "{:.1e}", "rel_err_eager": "{:.1e}", "top1": "{:.2f}", "us": "{:.1f}",
    "tokens_per_s": "{:.1f}", "floor_us": "{:.1f}", "floor_frac": "{:.0%}", "x_decode": "{:.2f}",
}  # fmt: skip
TITLES = {
    "decode": "AR decode (one token per step)",
    "verify": "Verify latency vs tree size T (draft trees)",
    "step": "Draft-free step at T = step_nodes (deepest path = the target's greedy tokens)",
    "core": "GDN core of one layer alone (x GDN layers below)",
    "compiled": "torch.compile'd glue (CUDA graphs)",
}


def _pick(
    table: pd.DataFrame, shape: str, group: str, method: str, t: int | None = None, column: str = "us"
) -> Any:
    """One row's value in ``column`` (the first matching row's; None where absent or empty)."""
    part = table[(table["shape"] == shape) & (table["group"] == group) & (table["method"] == method)]
    if t is not None:
        part = part[part["T"] == t]
    values = part[column].dropna()
    if not len(values):
        return None
    value = values.iloc[0]
    return value.item() if hasattr(value, "item") else value


def best_decode(table: pd.DataFrame, shape: str) -> pd.Series | None:
    """The fastest decode graph row of ``shape`` that passed its check (the decode the engine can run:
    cuBLAS, GEMV kernels or persistent), or None."""
    rows = table[
        (table["shape"] == shape)
        & (table["group"] == "decode")
        & (table["status"] == "ok")
        & table["method"].str.startswith("static_graph")
        & table["us"].notna()
    ]
    return rows.loc[rows["us"].idxmin()] if len(rows) else None


def targets(table: pd.DataFrame, shape: str, step_nodes: int) -> list[str]:
    """Issue 13's targets against the fastest decode graph (the verify ratio set for gdn-1.3b, the floor
    share for gdn-1.3b and qwen3.6-27b; both reported for every shape), met or missed and by how much."""
    best = best_decode(table, shape)
    verify = _pick(table, shape, "verify", "static_graph", step_nodes)
    share = TARGET_FLOOR.get(shape, TARGET_FLOOR["gdn-1.3b"])
    lines = ["| target | measured | verdict |", "|---|---|---|"]
    if best is not None and verify:
        decode, name = float(best["us"]), best["method"]
        ratio = verify / decode
        verdict = "met" if ratio <= TARGET_RATIO else f"missed by {ratio / TARGET_RATIO:.2f}x"
        lines.append(
            f"| verify({step_nodes}) <= {TARGET_RATIO}x decode "
            f"| {verify:.0f} us / {decode:.0f} us ({name}) = {ratio:.2f}x | {verdict} |"
        )
    else:
        lines.append(f"| verify({step_nodes}) <= {TARGET_RATIO}x decode | not measured | open |")
    if best is not None and pd.notna(best["floor_us"]):
        decode, floor, name = float(best["us"]), float(best["floor_us"]), best["method"]
        frac = floor / decode
        verdict = (
            "met" if frac >= share else f"missed: {frac:.0%} (needs {decode / floor * share:.2f}x faster)"
        )
        lines.append(
            f"| AR decode >= {share:.0%} of the weight-bandwidth floor "
            f"| {decode:.0f} us/token ({name}) vs floor {floor:.0f} us = {frac:.0%} | {verdict} |"
        )
    else:
        lines.append(f"| AR decode >= {share:.0%} of the weight-bandwidth floor | not measured | open |")
    return lines


def faster_or_slower(speedup: float) -> str:
    """A speedup as words: 1.25 -> "1.25x faster", 0.9 -> "1.11x slower"."""
    return f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup:.2f}x slower"


def _busy_line(table: pd.DataFrame, shape: str, group: str, method: str, t: int) -> list[str]:
    """Kernel time of one row's call by group (profiled eagerly) against the graph's time: the rest is
    the time between kernels (launch gaps, dependencies) under the graph."""
    us, busy = _pick(table, shape, group, method, t), _pick(table, shape, group, method, t, "kernel_busy_us")
    if us is None or busy is None:
        return []
    by_group = _pick(table, shape, group, method, t, "kernels_by_group")
    return [
        f"- {group} {method} (T={t}): {us:.0f} us per call; its kernels run {busy:.0f} us "
        f"({by_group}), so {us - busy:.0f} us ({(us - busy) / us:.0%}) pass between kernels under the graph."
    ]


def why_lines(table: pd.DataFrame, shape: str, step_nodes: int, info: dict[str, Any]) -> list[str]:
    """Where the time goes, from the rows alone: host overhead, kernels per step, GDN cores, fusion."""
    out = []

    def kernels_of(method: str) -> int | None:  # kernels per decode token of a decode row
        k = _pick(table, shape, "decode", method, 1, "kernels")
        return None if k is None else int(k)

    decode = _pick(table, shape, "decode", "static_graph", 1)
    eager = _pick(table, shape, "decode", "static_eager", 1)
    ops = _pick(table, shape, "decode", "static_graph", 1, "aten_ops")
    best = best_decode(table, shape)  # the decode of the targets' verdicts
    fastest = "static_graph" if best is None else str(best["method"])
    gdn = info.get("gdn_layers", 0)
    if decode and eager:
        out.append(
            f"- decode: eager {eager:.0f} us vs graph {decode:.0f} us: {eager - decode:.0f} us/token of "
            "python/host overhead removed by the graph."
        )
    kern = kernels_of(fastest)
    floor = _pick(table, shape, "decode", fastest, 1, "floor_us")
    if best is not None and kern and floor:
        excess = float(best["us"]) - floor
        out.append(
            f"- the fastest decode graph ({fastest}) runs {kern} kernels per token; above the floor it "
            f"spends {excess:.0f} us, {excess / kern:.2f} us per kernel."
        )
    decodes = dict.fromkeys(["static_graph", fastest])
    for group, method, t in (*(("decode", m, 1) for m in decodes), ("verify", "static_graph", step_nodes),
                             ("step", "step_graph", step_nodes)):  # fmt: skip
        out += _busy_line(table, shape, group, method, t)
    if ops is not None:
        n, layers = int(ops), info.get("layers")
        per_layer = f" (about {n / layers:.0f} per layer)" if layers else ""
        out.append(
            f"- decode step: {n} aten ops that launch work{per_layer}, counted by a dispatch "
            "mode on the eager call (device-independent; tests/models/test_static_decoder.py pins the CPU"
            " count)."
        )
    core1 = _pick(table, shape, "core", "gdn_core", 1)
    core_t = _pick(table, shape, "core", "gdn_core", step_nodes)
    verify = _pick(table, shape, "verify", "static_graph", step_nodes)
    if decode and core1:
        out.append(
            f"- fla's GDN recurrence alone (the unfused decoder's core): {core1:.1f} us/layer x {gdn} layers "
            f"= {core1 * gdn:.0f} us."
        )
    if verify and core_t and decode:
        out.append(
            f"- the GDN tree kernel alone at T={step_nodes}: {core_t:.1f} us/layer x {gdn} layers = "
            f"{core_t * gdn:.0f} us of verify's {verify:.0f} us (verify - decode = {verify - decode:.0f} us)."
        )

    def versus(new: str, new_us: float, old: str, old_us: float) -> tuple[str, str]:
        """("<new> us vs <old> us", "1.25x faster (k_new vs k_old kernels per token)")."""
        k_new, k_old = kernels_of(new), kernels_of(old)
        counts = f" ({k_new} vs {k_old} kernels per token)" if k_new and k_old else ""
        return f"{new_us:.0f} us vs {old_us:.0f} us", f"{faster_or_slower(old_us / new_us)}{counts}"

    unfused = _pick(table, shape, "decode", "static_graph_unfused", 1)
    if decode and unfused and info.get("fused"):
        times, speed = versus("static_graph", decode, "static_graph_unfused", unfused)
        out.append(f"- fused Triton glue: decode graph {times} unfused, {speed}.")
    gemv = _pick(table, shape, "decode", "static_graph_gemv", 1)
    if decode and gemv:
        times, speed = versus("static_graph_gemv", gemv, "static_graph", decode)
        out.append(
            "- GEMV kernels (norms, SiLU * up, residuals fused into the matmuls): decode graph "
            f"{times} with cuBLAS matmuls, {speed}."
        )
    comp = _pick(table, shape, "compiled", "static_graph_compiled", 1)
    if comp and decode:
        out.append(
            f"- with the glue under torch.compile the decode graph takes {comp:.0f} us "
            f"({faster_or_slower(decode / comp)} than the decode graph above)."
        )
    return out


def report_markdown(
    table: pd.DataFrame, manifest: dict[str, Any], out_dir: Path, figures: dict[str, str]
) -> str:
    """report.md's text: environment, per shape the targets, why, and one table per group; rows not timed."""
    from repro.reporting.report import markdown_table

    c = manifest.get("ceilings", {})
    cfg = manifest.get("config", {})
    step_nodes = int(cfg.get("step_nodes", 64))
    lines = [
        f"# Model benchmark: {out_dir.name}",
        "",
        f"- device: {manifest.get('bench_device')} ({manifest.get('device')})",
        f"- git sha: {manifest.get('git_sha')}; versions: "
        + ", ".join(f"{k} {v}" for k, v in manifest.get("versions", {}).items()),
        f"- timer: {c.get('timer')}; measured copy bandwidth {c.get('copy_GBps', math.nan):.0f} GB/s "
        f"(read + write), matmul bf16 {c.get('bf16_TFLOPs', math.nan):.1f} TFLOP/s",
        f"- weights: random {cfg.get('dtype')}; context {cfg.get('context')} tokens (HybridLM.prefill, "
        "copied into the static buffers); trees: best-first draft trees with random tokens",
        f"- {len(table)} rows: " + ", ".join(f"{k} {v}" for k, v in table["status"].value_counts().items()),
        "",
    ]
    for shape in dict.fromkeys(table["shape"]):
        info = manifest.get("models", {}).get(shape, {})
        lines += [f"## {shape}", ""]
        if info:
            lines += [
                f"What was timed: the full model, {info['layers']} layers executed per step = "
                f"{info['gdn_layers']} GDN + {info['attention_layers']} attention (counted in the timed "
                f"decoder: layers_gdn / layers_attn per row), hidden {info['hidden']}, "
                f"{info['parameters'] / 1e9:.2f}B parameters, "
                f"{info['weight_bytes_per_token'] / 1e9:.2f} GB of weights read per token; "
                f"GDN kernel {info['kernel']} ({info['kernel_dtype']}, "
                f"{info['precision']} dots).",
                "",
            ]
        lines += ["Targets (set for gdn-1.3b; shown for every shape):", ""]
        lines += targets(table, shape, step_nodes) + [""]
        why = why_lines(table, shape, step_nodes, info)
        if why:
            lines += ["Where the time goes:", ""] + why + [""]
        for group, title in TITLES.items():
            part = table[(table["shape"] == shape) & (table["group"] == group)]
            if part.empty:
                continue
            order = {m: i for i, m in enumerate(dict.fromkeys(part["method"]))}
            part = part.sort_values(["method", "T"], key=lambda c: c.map(order) if c.name == "method" else c)
            lines += [
                f"### {title}",
                "",
                markdown_table(part[REPORT_COLUMNS].reset_index(drop=True), FORMATS),
                "",
            ]
            if counts := counts_line(part.to_dict("records")):
                lines += [counts, ""]
    for name, path in figures.items():
        lines += [f"![{name}]({path})", ""]
    untimed = table[table["status"] != "ok"]
    notes = table[(table["status"] == "ok") & (table["reason"].fillna("") != "")]
    if len(untimed) or len(notes):
        lines += ["## Rows not timed, and notes", ""]
        lines += [
            f"- {r.status}: {r.shape} {r.group} {r.method} T={r.T}: {r.reason}" for r in untimed.itertuples()
        ]
        lines += [f"- note: {r.shape} {r.group} {r.method}: {r.reason}" for r in notes.itertuples()]
        lines.append("")
    lines += ["## Definitions", "", DEFINITIONS, ""]
    return "\n".join(lines)


DEFINITIONS = """\
- us: median of triton do_bench (CUDA events around each call, L2 flushed before each) of one call:
  for *_graph rows one CUDA-graph replay of the static decoder's step (static_graph_unfused: the
  decoder with fused=False, the torch glue of repro.models.static around the GDN cores;
  static_graph_gemv: the fused decoder with gemv=True, its decode matmuls on repro.gdn.triton_linear's
  GEMV kernels with the norms, SiLU * up and residual adds fused in, and the fused decode layer kernel;
  static_graph_gemv_core: the same GEMV kernels around the separate decode core, fuse_decode=False;
  static_graph_gemv_core_tree: that, its attention layers on the tree attention kernel;
  static_graph_persistent, pure-GDN shapes: every layer in one persistent launch,
  repro.gdn.triton_persistent, the embedding and the LM head around it), for
  *_eager
  rows the same step run op by op from Python, for hybrid_* rows HybridLM's per-sequence
  verify/commit (the harness's current path). CPU runs: a perf_counter loop (plumbing only).
- rel_err: ||logits - HybridLM's|| / ||HybridLM's|| on the same prefilled state and tree (HybridLM
  with its reference GDN path); state_err: the same over the committed state's buffers after the
  commit (vs HybridLM.commit of the same path); rel_err_eager: a graph's output vs the eager static
  call's (commit rows: the graph-committed state vs HybridLM's). Tolerance per dtype (tol); bf16
  compares two different bf16 paths (the static GDN kernels take bf16 q/k/v with tf32 dots, HybridLM
  upcasts to float32), so its tolerance is loose and its errors are a measurement.
- floor_us = max(bytes_min / measured copy bandwidth, flops / measured matmul rate): weights read once
  per step (one embedding row; the LM head in full), each GDN state read and written (decode) or read
  with delta and G written per node (verify), the KV cache read, the logits written; 2 flops per
  weight per token plus the GDN WY form and attention. floor_frac = floor_us / us (the fraction of the
  weight-bandwidth floor reached); x_decode = us / the decode graph's us.
- layers_gdn / layers_attn: GDN and attention layers that the timed call executed (counted in the
  static decoder on the checking call; HybridLM rows: its config's layers, all run by its loop).
  kernels: CUDA kernels one call launches (torch profiler on the eager call the graph captures).
  aten_ops: aten ops of one eager call that launch work (views and allocations excluded; a dispatch
  mode, so CPU runs count too; Triton/fla kernels are not aten ops and are not in it).
- step rows: set_tree = host tree upload (tokens, parents, ancestor mask, depths, conv gather index);
  verify_snapshots = verify that also writes every node's state (what the snapshot commit needs);
  accept_graph = greedy acceptance on the device (every step row checks it against TargetMatch on the
  same logits: a difference fails the row; the note compares it with TargetMatch on HybridLM's
  logits, which bf16 argmaxes may make differ); accept_host = TargetMatch on the host (one device
  read per accepted level); commit_* = the commit strategies alone (replay runs the recurrence over
  the slot's max depth with identity padding); step_graph = verify + accept + commit (the config's
  step_commit, closed_form by default) in one graph; readback = reading the accepted node and bonus
  back; step_eager = step_graph's work op by op (python/host overhead = step_eager - step_graph);
  hybrid_step = HybridLM verify + TargetMatch + commit.
- core rows: the GDN core of one layer on that layer's real inputs (T=1: fla's fused recurrence,
  the unfused decoder's core; else the fused Triton tree kernel), timed as one graph of 16 calls
  (inputs warm in L2 after the first) and divided by 16, so the graph's own launch is shared.
- kernels_by_group / kernel_busy_us (decode, verify at step_nodes, step_graph): the call's CUDA
  kernels profiled once eagerly, their device time summed per name group (gdn_core, commit,
  glue_triton, matmul_triton: the GEMV / row-tiled kernels, matmul, other); us - kernel_busy_us is the
  time between kernels under the graph."""


def write_figure(table: pd.DataFrame, folder: Path) -> dict[str, Path]:
    """model_verify_vs_T.png: verify latency vs T (graph; eager dashed), the fastest decode step and the
    target ratio times it."""
    from matplotlib.figure import Figure

    from repro.reporting.figures import save_png

    ok = table[(table["status"] == "ok") & (table["group"] == "verify")]
    shapes = list(dict.fromkeys(ok["shape"]))
    if not shapes:
        return {}
    fig = Figure(figsize=(5.5 * len(shapes), 4.4), layout="constrained")
    for ax, shape in zip(fig.subplots(1, len(shapes), squeeze=False)[0], shapes):
        for method, style in (("static_graph", "-"), ("static_eager", "--"), ("hybrid_eager", ":")):
            g = ok[(ok["shape"] == shape) & (ok["method"] == method)].sort_values("T")
            if len(g):
                ax.plot(g["T"], g["us"] / 1e3, ls=style, marker="o", label=f"verify ({method})")
        best = best_decode(table, shape)
        decode = float(best["us"]) if best is not None else _pick(table, shape, "decode", "static_eager", 1)
        if decode:
            ax.axhline(decode / 1e3, color="k", lw=1, label="decode step (fastest)")
            ax.axhline(TARGET_RATIO * decode / 1e3, color="k", lw=1, ls="--", label=f"{TARGET_RATIO}x decode")
        ts = sorted({int(t) for t in ok[ok["shape"] == shape]["T"]})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ts, [str(t) for t in ts])
        ax.minorticks_off()
        ax.set_xlabel("tree nodes T")
        ax.set_ylabel("ms per verify (whole model)")
        ax.set_title(f"{shape}: verify latency vs tree size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    return {"verify latency vs tree size": save_png(fig, folder / "model_verify_vs_T.png")}


KIND = RunKind(
    "bench-model",
    fields_parser("shape", "group", "method", "T", "status"),
    build_report,
    ("report.md", "table.csv"),
)
