"""SpecLA's main table: AR, FLA-SD, Chain and SpecLA on the mixed suite, GSM8K and HumanEval.

Experiment: ``repro/experiments/specla.yaml`` (``kind: specla``): ``fla_sd`` (the EAGLE chain verified
with fla's stock chunk kernel, committed by replay through its fused recurrence), ``eagle_chain`` (the
same chain with the tree verifier and closed-form commit) and ``specla`` (EAGLE confidence-pruned tree,
tree-masked verify, closed-form commit) against AR. Baselines: ``baselines/specla.yaml`` ``end_to_end``
(SpecLA over AR: 1.42x mixed, 1.70x GSM8K, 1.06x HumanEval).

**Mixed suite**: the paper names a "mixed suite" without defining its weights (baselines/specla.yaml,
shared/papers.md). Here it is the prompts of MT-Bench (both turns), GSM8K and HumanEval, the same
``limit`` of prompts per suite, pooled: tokens/s, MAL and the speedup token-weighted over the records of
those three suites only (not the run's other suites), speedup paired per prompt
(:mod:`repro.reporting.stats`, bootstrap 95% CIs). It is **not** an equal-weight mix: MT-Bench's two turns
give it about half the tokens; the report says each suite's share of the mixed tokens.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from repro.paper.common import (
    baselines,
    figure_link,
    fmt_ci,
    header,
    paper_cell,
    paper_kind,
    route_methods,
    save_figure,
    summary_section,
    table_text,
)  # fmt: skip
from repro.reporting.records import DecodeRecord
from repro.reporting.report import ALL_SUITES, reference_route, suites_of, summarize
from repro.reporting.rundir import Run
from repro.reporting.stats import MIN_UNITS, SPEEDUP, compare

EXPERIMENT = "specla"
BASELINE = "specla"  # baselines/specla.yaml, key end_to_end
METHODS = {"ar": "AR", "fla_sd": "FLA-SD", "eagle_chain": "Chain", "specla": "SpecLA"}
MIXED = "mixed"
MIXED_SUITES = ("mt_bench", "gsm8k", "humaneval")
FIGURE = "specla"


def mixed_shares(records: list[DecodeRecord], route: str) -> dict[str, float]:
    """Each mixed suite's share of ``route``'s new tokens on the mixed suite."""
    mine = [r for r in records if r.route == route]
    tokens = {s: sum(r.new_tokens for r in mine if r.suite == s) for s in MIXED_SUITES}
    total = sum(tokens.values())
    return {s: t / total for s, t in tokens.items()} if total else {}


def table(records: list[DecodeRecord], paper: dict | None = None) -> pd.DataFrame:
    """One row per (workload, method): the mixed suite (when all three suites ran), then each suite; a
    method without records in a workload has no row there."""
    paper = baselines(BASELINE) if paper is None else paper
    published = {
        e["suite"]: e["value"] for e in paper.get("end_to_end", []) if e["metric"] == "speedup_vs_ar"
    }
    ar = reference_route(records)
    suites = suites_of(records)
    summary = summarize(records).set_index(["suite", "route"])
    mixed = summarize([r for r in records if r.suite in MIXED_SUITES]).set_index(["suite", "route"])
    workloads = [(s, [s]) for s in suites]
    if set(MIXED_SUITES) <= set(suites):
        workloads.insert(0, (MIXED, list(MIXED_SUITES)))
    routes = route_methods(records)
    rows = []
    for workload, members in workloads:
        for route, (kind, _) in routes.items():
            if kind not in METHODS:
                continue
            if workload == MIXED:
                if any((m, route) not in summary.index for m in members):
                    continue
                s = mixed.loc[(ALL_SUITES, route)]
            elif (workload, route) in summary.index:
                s = summary.loc[(workload, route)]
            else:
                continue
            sp = compare(records, route, ar, members, SPEEDUP) if ar else None
            value = published.get(workload) if kind == "specla" else None
            rows.append(
                {
                    "workload": workload, "method": METHODS[kind], "route": route, "n": sp.n if sp else 0,
                    "turns": int(s["turns"]) if workload != MIXED else sum(
                        int(summary.loc[(m, route)]["turns"]) for m in members),
                    "tokens_per_s": float(s["tokens_per_s"]), "speedup": sp.value if sp else math.nan,
                    "speedup_low": sp.low if sp else math.nan, "speedup_high": sp.high if sp else math.nan,
                    "paper_speedup": value if value is not None else math.nan, "MAL": float(s["MAL"]),
                    "lossless": s["lossless"],
                }
            )  # fmt: skip
    return pd.DataFrame(rows)


def _shares_text(records: list[DecodeRecord]) -> str:
    ar = reference_route(records)
    shares = mixed_shares(records, ar) if ar else {}
    if not shares:
        return ""
    return " (AR's tokens: " + ", ".join(f"{s} {100 * v:.0f}%" for s, v in shares.items()) + ")"


def _text(t: pd.DataFrame) -> pd.DataFrame:
    out = []
    for r in t.itertuples(index=False):
        paper = None if math.isnan(r.paper_speedup) else r.paper_speedup
        paper_text, ratio = paper_cell(r.speedup, paper) if r.method == "SpecLA" else ("-", "-")
        out.append(
            {
                "workload": r.workload, "method": r.method, "n": r.n, "tokens/s": f"{r.tokens_per_s:.1f}",
                "speedup [95% CI]": "1.00x (reference)" if r.method == "AR" else fmt_ci(
                    r.speedup, r.speedup_low, r.speedup_high, "x"),
                "paper": paper_text, "ours/paper": ratio, "MAL": f"{r.MAL:.2f}", "lossless": r.lossless,
            }
        )  # fmt: skip
    return pd.DataFrame(out)


def plot(t: pd.DataFrame, folder: Path) -> list[str]:
    """Speedup over AR per workload and method (CI bars), the paper's SpecLA numbers as markers."""
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    workloads = list(dict.fromkeys(t["workload"]))
    methods = [m for m in dict.fromkeys(t["method"]) if m != "AR"]
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        m = t[t["method"] == method].set_index("workload").reindex(workloads)
        x = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(workloads))]
        err = [
            (m["speedup"] - m["speedup_low"]).fillna(0).clip(lower=0),
            (m["speedup_high"] - m["speedup"]).fillna(0).clip(lower=0),
        ]
        ax.bar(x, m["speedup"], width=width, yerr=err, capsize=2, label=method)
        if method == "SpecLA":
            ax.scatter(
                x, m["paper_speedup"], marker="*", s=90, color="black", zorder=3, label="SpecLA (paper)"
            )
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("speedup vs AR (tokens/s)")
    ax.set_title("SpecLA main table")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure(fig, folder, FIGURE)


def build_report(run: Run, figures_dir: Path | None) -> str:
    """report.md, table.csv, summary.csv and the figure of a SpecLA main-table run, from records."""
    lines = header(
        run,
        "SpecLA main table",
        "Speedup over AR (tokens/s, paired per prompt) of FLA-SD, Chain and SpecLA on the mixed suite, GSM8K"
        " and HumanEval (repro/paper/specla_table.py).",
    )
    if not run.records:
        text = "\n".join(lines + ["No records yet.", ""])
        run.write("report.md", text)
        return text
    t = table(run.records)
    run.write("table.csv", t.to_csv(index=False))
    lines += [
        "## Main table",
        "",
        table_text(_text(t)),
        "",
        "- mixed: MT-Bench (both turns), GSM8K and HumanEval (the same limit of prompts per suite), pooled"
        " token-weighted over those suites' records, not an equal-weight mix"
        + _shares_text(run.records)
        + "; n: prompts; CIs: percentile bootstrap over prompts, 95%, 9999 resamples"
        + f" (none below {MIN_UNITS} prompts).",
        "- paper: baselines/specla.yaml (GDN-1.3B, H100): SpecLA 1.42x mixed, 1.70x GSM8K, 1.06x HumanEval;"
        " it gives no number for FLA-SD or Chain in baselines/.",
        "- CPU tokens/s of a tiny model time Python, not GPU work; MAL is a property of the pair.",
        "",
    ]
    if figures_dir is not None:
        plot(t, figures_dir)
        lines += [figure_link(run, figures_dir, FIGURE, "SpecLA main table: speedup"), ""]
    lines += summary_section(run)
    text = "\n".join(lines)
    run.write("report.md", text)
    return text


KIND = paper_kind("paper-specla", build_report)
