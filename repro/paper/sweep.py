"""Parameter sweeps (Weaver Appendix B: tree-budget sweeps): MAL and tokens/s vs one route parameter.

Experiment: ``repro/experiments/sweep.yaml`` (``kind: sweep``), driven by ``repro sweep --budget
16,32,64`` or ``--param NAME=v1,v2``: every non-AR route (DDTree, DFlash-TfM, SpecLA by default) once per
value (the experiment's ``sweep`` setting; names ``<route>@<param>=<value>``, values checked by the
route registry). Per base route, suite and value: MAL, tokens/s and the speedup over AR (paired per
prompt, bootstrap 95% CI; "all" pools every prompt), curves, and the best value per route (highest
pooled speedup; highest MAL beside it). The paper's Appendix B numbers are not in baselines/.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from repro.paper.common import (
    figure_link,
    fmt_ci,
    header,
    paper_kind,
    save_figure,
    summary_section,
)
from repro.reporting.records import DecodeRecord
from repro.reporting.report import ALL_SUITES, markdown_table, reference_route, suites_of, summarize
from repro.reporting.rundir import Run
from repro.reporting.stats import MIN_UNITS, SPEEDUP, compare

EXPERIMENT = "sweep"
BASELINE = None  # Appendix B's curves are not in baselines/
FIGURE = "sweep"
SEP = "@"


def swept(records: list[DecodeRecord], param: str) -> dict[str, tuple[str, float]]:
    """route -> (base route name, value of ``param``) for every swept route."""
    out = {}
    for r in records:
        if SEP in r.route and param in r.route_params:
            out[r.route] = (r.route.split(SEP)[0], r.route_params[param])
    return out


def table(records: list[DecodeRecord], param: str) -> pd.DataFrame:
    """One row per (base route, suite incl. all, value): n, MAL, tokens/s, speedup with CI; a route without
    records in a suite (a partial run) has no row there."""
    ar = reference_route(records)
    suites = suites_of(records)
    summary = summarize(records).set_index(["suite", "route"])
    rows = []
    for route, (base, value) in swept(records, param).items():
        for suite, members in [(s, [s]) for s in suites] + [(ALL_SUITES, suites)]:
            if (suite, route) not in summary.index:  # a partial run: this route has no record there yet
                continue
            s = summary.loc[(suite, route)]
            sp = compare(records, route, ar, members, SPEEDUP) if ar else None
            rows.append(
                {
                    "route": base, "kind": next(r.route_params["kind"] for r in records if r.route == route),
                    "suite": suite, param: value, "n": sp.n if sp else int(s["prompts"]),
                    "MAL": float(s["MAL"]), "tokens_per_s": float(s["tokens_per_s"]),
                    "speedup": sp.value if sp else math.nan, "speedup_low": sp.low if sp else math.nan,
                    "speedup_high": sp.high if sp else math.nan, "lossless": s["lossless"],
                }
            )  # fmt: skip
    df = pd.DataFrame(rows)
    return df.sort_values(["route", "suite", param], kind="stable", ignore_index=True) if rows else df


def best(t: pd.DataFrame, param: str) -> pd.DataFrame:
    """Per base route, on the pooled ("all") rows: the values with the highest speedup (with its n and
    interval) and MAL."""
    rows = []
    for route, g in t[t["suite"] == ALL_SUITES].groupby("route", sort=False):
        by_speed = g.loc[g["speedup"].fillna(-math.inf).idxmax()]
        by_mal = g.loc[g["MAL"].idxmax()]
        rows.append(
            {
                "route": route, f"best {param} (speedup)": by_speed[param], "n": by_speed["n"],
                "speedup": by_speed["speedup"], "speedup_low": by_speed["speedup_low"],
                "speedup_high": by_speed["speedup_high"], f"best {param} (MAL)": by_mal[param],
                "MAL": by_mal["MAL"],
            }
        )  # fmt: skip
    return pd.DataFrame(rows)


def plot(t: pd.DataFrame, param: str, folder: Path) -> list[str]:
    """MAL and tokens/s vs the swept value: one line per (route, suite), pooled rows bold."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_m, ax_t = fig.subplots(1, 2)
    for (route, suite), g in t.groupby(["route", "suite"], sort=False):
        pooled = suite == ALL_SUITES
        style = {"marker": "o", "linewidth": 2.2 if pooled else 0.9, "alpha": 1.0 if pooled else 0.6}
        ax_m.plot(g[param], g["MAL"], label=f"{route} / {suite}", **style)
        ax_t.plot(g[param], g["tokens_per_s"], label=f"{route} / {suite}", **style)
    for ax, what in ((ax_m, "MAL (tokens per verify)"), (ax_t, "tokens/s (decode)")):
        ax.set_xlabel(param)
        ax.set_ylabel(what)
        if (
            pd.api.types.is_numeric_dtype(t[param])
            and (t[param] > 0).all()
            and t[param].max() / t[param].min() >= 8
        ):
            ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    ax_m.legend(fontsize="x-small", ncol=2)
    fig.suptitle(f"{param} sweep")
    return save_figure(fig, folder, FIGURE)


def build_report(run: Run, figures_dir: Path | None) -> str:
    """report.md, table.csv, best.csv, summary.csv and the curves of a sweep run, from records."""
    sweep = run.manifest.get("config", {}).get("sweep") or {}
    param = sweep.get("param", "budget")
    lines = header(
        run,
        f"Sweep of {param}",
        f"MAL and tokens/s vs {param} per route and suite, and the best {param} per route"
        " (repro/paper/sweep.py; Weaver Appendix B for budgets).",
    )
    t = table(run.records, param)
    if t.empty:
        text = "\n".join(lines + ["No swept records yet.", ""])
        run.write("report.md", text)
        return text
    b = best(t, param)
    run.write("table.csv", t.to_csv(index=False))
    run.write("best.csv", b.to_csv(index=False))
    shown = t.assign(
        speedup=[fmt_ci(r.speedup, r.speedup_low, r.speedup_high, "x") for r in t.itertuples(index=False)]
    ).drop(columns=["speedup_low", "speedup_high"])
    best_shown = b.assign(
        speedup=[fmt_ci(r.speedup, r.speedup_low, r.speedup_high, "x") for r in b.itertuples(index=False)]
    ).drop(columns=["speedup_low", "speedup_high"])
    lines += [
        f"## Best {param} per route (pooled over the suites)",
        "",
        markdown_table(best_shown, {"speedup": "{}"}),
        "",
        "- chosen on the prompts it is reported on: the best value's speedup and interval lean optimistic by"
        " the pick.",
        "",
        "## Every value",
        "",
        markdown_table(shown, {"speedup": "{}"}),
        "",
        "- n: prompts; speedup over AR paired per prompt, percentile bootstrap 95% CI (none below"
        f" {MIN_UNITS} prompts); all: every prompt pooled.",
        "- paper: Weaver Appendix B's sweep numbers are not in baselines/; nothing to print beside.",
        "- CPU tokens/s of a tiny model time Python, not GPU work: the best value by speed is this"
        " machine's.",
        "",
    ]
    if figures_dir is not None:
        plot(t, param, figures_dir)
        lines += [figure_link(run, figures_dir, FIGURE, f"MAL and tokens/s vs {param}"), ""]
    lines += summary_section(run)
    text = "\n".join(lines)
    run.write("report.md", text)
    return text


KIND = paper_kind("sweep", build_report, ("best.csv",))
