"""Uniform protocol (``repro falsify --uniform-protocol RUN_DIR``): the reviewers' check 4.

From a decode run whose routes run several methods under several acceptance rules (the route
parameter ``acceptance``): per rule that every method was run under, the table of every method under
that same rule, beside the best-of-protocol table (each method under its own best rule, as Weaver's
Table 2 does), and whether the ranking of methods (by speedup over AR, then MAL) changes. A method
is a route's parameters without its name, acceptance rule and commit strategy; AR routes are the
baseline, not methods. The command exits 3 when the ranking changes under some uniform rule.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from repro.errors import ReproError
from repro.reporting.records import build_manifest
from repro.reporting.rundir import Run, RunDir, RunKind, fields_parser

NOT_METHOD = ("acceptance", "commit", "name", "drafter", "weaver")


def method_of(params: dict[str, Any]) -> str:
    """``kind`` plus its other parameters (checkpoints, rule and commit left out)."""
    rest = ",".join(f"{k}={v}" for k, v in sorted(params.items()) if k not in (*NOT_METHOD, "kind"))
    return f"{params.get('kind')}" + (f" ({rest})" if rest else "")


def ranking(rows: pd.DataFrame) -> list[str]:
    """Methods best first: speedup, then MAL."""
    return rows.sort_values(["speedup", "MAL"], ascending=False, kind="stable")["method"].tolist()


def protocol_tables(rows: pd.DataFrame) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """({shared rule: every method under it}, best-of-protocol: each method's best rule's row)."""
    methods = list(dict.fromkeys(rows["method"]))
    shared = [
        r for r in dict.fromkeys(rows["rule"]) if set(rows[rows["rule"] == r]["method"]) == set(methods)
    ]
    uniform = {r: rows[rows["rule"] == r].reset_index(drop=True) for r in shared}
    best = (
        rows.sort_values(["speedup", "MAL"], ascending=False, kind="stable")
        .groupby("method", sort=False)
        .head(1)
        .reset_index(drop=True)
    )
    return uniform, best


def ranking_changes(rows: pd.DataFrame) -> dict[str, bool]:
    """Per shared rule: whether its ranking differs from the best-of-protocol ranking."""
    uniform, best = protocol_tables(rows)
    return {rule: ranking(t) != ranking(best) for rule, t in uniform.items()}


def method_rows(records: list[Any]) -> pd.DataFrame:
    """One row per non-AR route of a decode run: method, rule, route, n (prompts paired with AR), speedup
    with its paired 95% interval (:func:`repro.reporting.stats.compare`, every suite pooled: the decode
    report's "all (pooled)" row), MAL, tokens/s."""
    from repro.reporting.report import reference_route, summarize
    from repro.reporting.stats import SPEEDUP, compare

    summary = summarize(records)
    pooled = summary[summary["suite"] == "all"].set_index("route")
    params = {r.route: r.route_params for r in records}
    ref = reference_route(records)
    suites = list(dict.fromkeys(r.suite for r in records))
    rows = []
    for name, p in params.items():
        if p.get("kind") == "ar":
            continue
        paired = compare(records, name, ref, suites, SPEEDUP) if ref is not None else None
        rows.append(
            {"method": method_of(p), "rule": p.get("acceptance", "greedy"), "route": name,
             "n": paired.n if paired else 0, "speedup": float(pooled.loc[name, "speedup"]),
             "ci_low": paired.low if paired else math.nan, "ci_high": paired.high if paired else math.nan,
             "MAL": float(pooled.loc[name, "MAL"]), "tokens_per_s": float(pooled.loc[name, "tokens_per_s"])}
        )  # fmt: skip
    return pd.DataFrame(rows, columns=RECORDED)


def uniform_protocol(src: Run, out: str | Path) -> tuple[RunDir, dict[str, bool]]:
    """Write a uniform-protocol run directory for the run ``src`` (read back by the caller, a decode run
    or refused); returns it and, per shared rule, whether the ranking changes."""
    if src.kind.name != "decode":
        raise ReproError(
            f"{src.path} is a {src.kind.name} run; --uniform-protocol needs a decode run directory"
        )
    rows = method_rows(src.records)
    if rows["rule"].nunique() < 2 or rows["method"].nunique() < 2:
        raise ReproError(
            f"{src.path} has {rows['method'].nunique()} method(s) under {rows['rule'].nunique()} acceptance"
            " rule(s): --uniform-protocol needs at least two methods and routes under several rules"
        )
    if not protocol_tables(rows)[0]:
        raise ReproError(
            f"{src.path}: no acceptance rule was run with every method, so no uniform table exists"
        )
    config = {
        "check": "uniform-protocol",
        "source": str(src.path),
        "source_config_hash": src.manifest["config_hash"],
    }
    with RunDir(out, build_manifest(config), kind=KIND) as run:
        for row in rows.to_dict("records"):
            run.append(row)
        run.write_report()
        return run, ranking_changes(rows)


COLUMNS = ["method", "rule", "route", "speedup", "MAL", "tokens_per_s"]  # the records made before n was kept
RECORDED = ["method", "rule", "route", "n", "speedup", "ci_low", "ci_high", "MAL", "tokens_per_s"]


def build_report(run: Run, figures_dir: Path | None) -> str:
    from repro.reporting.report import markdown_table
    from repro.reporting.stats import MIN_UNITS

    paired = bool(run.records) and all("n" in r for r in run.records)
    rows = pd.DataFrame(run.records, columns=RECORDED if paired else COLUMNS)  # records: sorted keys
    run.write("table.csv", rows.to_csv(index=False))
    uniform, best = protocol_tables(rows)
    changes = ranking_changes(rows)
    fmt = {
        "speedup": "{:.2f}",
        "ci_low": "{:.2f}",
        "ci_high": "{:.2f}",
        "MAL": "{:.2f}",
        "tokens_per_s": "{:.1f}",
    }
    n_text = (
        " n: the prompts paired with AR; ci_low, ci_high: the speedup's 95% percentile bootstrap interval"
        f" over them (none below {MIN_UNITS} prompts)."
        if paired
        else " n and intervals not recorded (rows made before this check kept them): the source run's report"
        " gives both, in its paired speedup table's all (pooled) rows."
    )
    changed = [r for r, c in changes.items() if c]
    verdict = (
        f"**The ranking of methods changes under a uniform protocol ({', '.join(changed)})**: the"
        " best-of-protocol table's ranking does not hold when every method uses the same rule."
        if changed
        else "**The ranking of methods is the same under every uniform rule as best-of-protocol.**"
    )
    parts = [
        f"# Uniform protocol vs best-of-protocol: {run.manifest['config']['source']}",
        "",
        verdict,
        "",
        "Speedup = tokens/s over the run's AR route, pooled over suites (docs/metrics.md). Methods ranked"
        " by speedup, then MAL." + n_text,
        "",
        "## Best-of-protocol (each method under its best rule)",
        "",
        markdown_table(best.assign(rank=range(1, len(best) + 1)), fmt),
    ]
    for rule, t in uniform.items():
        order = {m: i + 1 for i, m in enumerate(ranking(t))}
        t = t.assign(rank=t["method"].map(order)).sort_values("rank")
        parts += ["", f"## Uniform: every method under `{rule}` (ranking changes: {changes[rule]})", "",
                  markdown_table(t, fmt)]  # fmt: skip
    text = "\n".join(parts) + "\n"
    run.write("report.md", text)
    return text


KIND = RunKind(
    "falsify-uniform-protocol",
    fields_parser("method", "rule", "route", "speedup", "MAL"),
    build_report,
    ("report.md", "table.csv"),
)
