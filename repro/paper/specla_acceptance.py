"""SpecLA's controlled acceptance study as its figure: speedup vs acceptance probability p per draft
length, with the break-even p beside the paper's ~0.7.

Experiment: ``repro/experiments/acceptance.yaml`` (``kind: acceptance``): a synthetic chain drafter
that proposes AR's own token with probability p, over a grid of p x draft length k. Table and
break-even p: :func:`repro.reporting.report.acceptance_table` and :func:`break_even_p`. Baselines:
``baselines/specla.yaml`` ``controlled_acceptance`` (break-even p ~ 0.7 at every tested draft length).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from repro.paper.common import baselines, figure_link, header, paper_kind, save_figure, summary_section
from repro.reporting.report import acceptance_table, break_even_p, markdown_table
from repro.reporting.rundir import Run

EXPERIMENT = "acceptance"
BASELINE = "specla"  # baselines/specla.yaml, key controlled_acceptance
FIGURE = "acceptance"


def paper_break_even(paper: dict | None = None) -> float | None:
    paper = baselines(BASELINE) if paper is None else paper
    rows = [
        r
        for r in paper.get("controlled_acceptance", [])
        if r["metric"] == "break_even_acceptance_probability"
    ]
    return float(rows[0]["value"]) if rows else None


def break_even_table(acc: pd.DataFrame, paper: float | None) -> pd.DataFrame:
    """Per (kind, width, k): the break-even p of the records beside the paper's."""
    rows = []
    for (kind, width), part in acc.groupby(["kind", "width"], sort=False, dropna=False):
        lowest = part.groupby("k")["p"].min()
        for k, p in break_even_p(part, kind=kind).items():
            where = "not reached on the grid" if p is None else ("<=" if p == lowest[k] else "=")
            rows.append(
                {
                    "kind": kind, "width": width, "k": k, "break_even_p": math.nan if p is None else p,
                    "reached": where, "paper_p": math.nan if paper is None else paper,
                }
            )  # fmt: skip
    return pd.DataFrame(rows)


def plot(acc: pd.DataFrame, paper: float | None, folder: Path) -> list[str]:
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.add_subplot()
    for (kind, width, k), g in acc.groupby(["kind", "width", "k"], sort=True, dropna=False):
        label = f"k={k}" + ("" if kind == "synthetic_chain" else f" tree width {width:g}")
        ax.plot(g["p"], g["speedup"], marker="o", label=label)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="AR (speedup 1)")
    if paper is not None:
        ax.axvline(paper, color="black", linestyle=":", linewidth=1, label=f"paper break-even p ~ {paper:g}")
    ax.set_xlabel("acceptance probability p")
    ax.set_ylabel("speedup vs AR (tokens/s)")
    ax.set_title("Controlled acceptance study (SpecLA)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure(fig, folder, FIGURE)


def timing_caveat(manifest: dict) -> str:
    """What the break-even p of this run is a property of: the GPU engine's per-step costs, or (CPU, eager
    engine) per-step Python overheads."""
    on_gpu = (manifest.get("device_info") or {}).get("cuda")
    engine = (manifest.get("config") or {}).get("engine", "eager")
    if on_gpu and engine == "graphed":
        return (
            f"- measured on {on_gpu} with the graphed engine (CUDA graphs): the break-even p is a property"
            " of this target's verify and commit cost per step on this GPU (here the tiny family's, not the"
            " paper's 1.3B model)."
        )
    return (
        "- tokens/s of a tiny model on the eager engine (or the CPU) time Python, not GPU work: the"
        " break-even p here is a property of this machine's per-step overheads, not of the GPU kernels."
    )


def build_report(run: Run, figures_dir: Path | None) -> str:
    """report.md, table.csv (per route), break_even.csv, summary.csv and the figure, from records."""
    lines = header(
        run,
        "SpecLA controlled acceptance study",
        "Speedup of a synthetic chain drafter vs its per-token acceptance probability p and draft length k"
        " (repro/paper/specla_acceptance.py; docs/metrics.md, Controlled acceptance study).",
    )
    acc = acceptance_table(run.records)
    if acc.empty:
        text = "\n".join(lines + ["No synthetic routes recorded yet.", ""])
        run.write("report.md", text)
        return text
    paper = paper_break_even()
    be = break_even_table(acc, paper)
    run.write("table.csv", acc.to_csv(index=False))
    run.write("break_even.csv", be.to_csv(index=False))
    lines += [
        "## Break-even acceptance probability (speedup 1)",
        "",
        markdown_table(be, {"break_even_p": "{:.3f}", "paper_p": "{:g}"}),
        "",
        f"- paper: baselines/specla.yaml: below p ~ {paper:g} speculation is unprofitable at every tested"
        " draft length (GDN-1.3B, H100)."
        if paper is not None
        else "- paper: no number in baselines/.",
        timing_caveat(run.manifest),
        "",
        "## Per route",
        "",
        markdown_table(acc),
        "",
    ]
    if figures_dir is not None:
        plot(acc, paper, figures_dir)
        lines += [figure_link(run, figures_dir, FIGURE, "speedup vs acceptance probability"), ""]
    lines += summary_section(run)
    text = "\n".join(lines)
    run.write("report.md", text)
    return text


KIND = paper_kind("paper-acceptance", build_report, ("break_even.csv",))
