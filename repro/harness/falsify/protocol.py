"""Uniform protocol (``repro falsify --uniform-protocol RUN_DIR``): the reviewers' check 4.

From a decode run whose routes run several methods under several acceptance rules (the route
parameter ``acceptance``): per rule that every method was run under, the table of every method under
that same rule, beside the best-of-protocol table (each method under its own best rule, as Weaver's
Table 2 does), and whether the ranking of methods (by speedup over AR, then MAL) changes. A method
is a route's parameters without its name, acceptance rule and commit strategy; AR routes are the
baseline, not methods. A ranking changes only where a pair of methods swaps places and the swap is more
than noise: under the uniform rule the method now ahead is faster than the one it passed, paired per
prompt, with the 95% interval of that ratio above 1 (:func:`swaps`; a swap below :data:`MIN_UNITS`
prompts has no interval and counts as within noise). The command exits 3 when the ranking changes under
some uniform rule. Runs of this check made before the swaps were recorded are judged on point estimates,
as they were (their report says so).
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


def ranking_changes(rows: pd.DataFrame, swapped: list[dict[str, Any]] | None = None) -> dict[str, bool]:
    """Per shared rule: whether its ranking changes from the best-of-protocol ranking: a swap beyond noise
    among ``swapped`` (:func:`swaps`' records), or, without them (runs made before they were recorded),
    any difference of the point-estimate rankings."""
    uniform, best = protocol_tables(rows)
    if swapped is None:
        return {rule: ranking(t) != ranking(best) for rule, t in uniform.items()}
    return {rule: any(s["rule"] == rule and s["beyond_noise"] for s in swapped) for rule in uniform}


def swaps(rows: pd.DataFrame, records: list[Any]) -> list[dict[str, Any]]:
    """Every pair of methods a uniform rule ranks the other way round from best-of-protocol: the method now
    ahead over the one it passed, both under that rule, as a paired ratio of tokens/s per prompt with its
    95% interval (:func:`repro.reporting.stats.compare`, every suite pooled); ``beyond_noise`` when the
    interval lies above 1."""
    from repro.reporting.report import suites_of
    from repro.reporting.stats import SPEEDUP, compare

    uniform, best = protocol_tables(rows)
    place = {m: i for i, m in enumerate(ranking(best))}
    suites = suites_of(records)
    out = []
    for rule, t in uniform.items():
        route = dict(zip(t["method"], t["route"]))
        order = ranking(t)
        for i, ahead in enumerate(order):
            for behind in order[i + 1 :]:
                if place[ahead] < place[behind]:
                    continue
                paired = compare(records, route[ahead], route[behind], suites, SPEEDUP)
                out.append({
                    "swap": True, "rule": rule, "ahead": ahead, "behind": behind, "n": paired.n,
                    "ratio": paired.value, "low": paired.low, "high": paired.high,
                    "beyond_noise": bool(paired.low > 1.0),
                })  # fmt: skip
    return out


def method_rows(records: list[Any]) -> pd.DataFrame:
    """One row per non-AR route of a decode run: method, rule, route, n (prompts paired with AR), speedup
    with its paired 95% interval (:func:`repro.reporting.stats.compare`, every suite pooled: the decode
    report's "all (pooled)" row), MAL, tokens/s."""
    from repro.reporting.report import reference_route, suites_of, summarize
    from repro.reporting.stats import SPEEDUP, compare

    summary = summarize(records)
    pooled = summary[summary["suite"] == "all"].set_index("route")
    params = {r.route: r.route_params for r in records}
    ref = reference_route(records)
    suites = suites_of(records)
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
        "swaps": PAIRED_SWAPS,
    }
    swapped = swaps(rows, src.records)
    with RunDir(out, build_manifest(config), kind=KIND) as run:
        for row in [*rows.to_dict("records"), *swapped]:
            run.append(row)
        run.write_report()
        return run, ranking_changes(rows, swapped)


PAIRED_SWAPS = "paired"  # config["swaps"] of the runs that record every swap with its paired interval
COLUMNS = ["method", "rule", "route", "speedup", "MAL", "tokens_per_s"]  # the records made before n was kept
RECORDED = ["method", "rule", "route", "n", "speedup", "ci_low", "ci_high", "MAL", "tokens_per_s"]


def build_report(run: Run, figures_dir: Path | None) -> str:
    from repro.reporting.report import markdown_table
    from repro.reporting.stats import MIN_UNITS

    methods = [r for r in run.records if not r.get("swap")]
    swapped = [r for r in run.records if r.get("swap")]
    paired = bool(methods) and all("n" in r for r in methods)
    rows = pd.DataFrame(methods, columns=RECORDED if paired else COLUMNS)  # records: sorted keys
    run.write("table.csv", rows.to_csv(index=False))
    uniform, best = protocol_tables(rows)
    judged = run.manifest["config"].get("swaps") == PAIRED_SWAPS  # its swaps recorded (none: none swapped)
    changes = ranking_changes(rows, swapped if judged else None)
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
    noise = [r for r in uniform if r not in changed and any(s["rule"] == r for s in swapped)]
    verdict = (
        f"**The ranking of methods changes under a uniform protocol ({', '.join(changed)})**: the"
        " best-of-protocol table's ranking does not hold when every method uses the same rule"
        + (": a pair of methods swaps places beyond noise (Swaps below)." if judged else ".")
        if changed
        else "**The ranking of methods is the same under every uniform rule as best-of-protocol**"
        + (f" up to noise (methods swap places under {', '.join(noise)}, none beyond it: Swaps below)."
           if noise else ".")
    )  # fmt: skip
    if judged and any(s["n"] < MIN_UNITS for s in swapped):
        verdict += f" A swap on fewer than {MIN_UNITS} prompts has no interval: it is evidence neither way."
    if not judged:
        verdict += (
            " (Judged on point estimates: this run predates the paired check of each swap, so two methods"
            " tied within noise count as a change.)"
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
    if swapped:
        cols = ["rule", "ahead", "behind", "n", "ratio", "low", "high", "beyond_noise"]
        parts += [
            "", "## Swaps (a uniform rule's order against best-of-protocol's)", "",
            markdown_table(pd.DataFrame(swapped, columns=cols), {"ratio": "{:.3f}", "low": "{:.3f}",
                                                                 "high": "{:.3f}"}),
            "", "ratio: the tokens/s of the method now ahead over the one it passed, both under the rule,"
            f" paired per prompt (every suite pooled), with its 95% percentile bootstrap interval (none below"
            f" {MIN_UNITS} prompts); beyond_noise: the interval lies above 1. Only such a swap changes the"
            " ranking.",
        ]  # fmt: skip
    text = "\n".join(parts) + "\n"
    run.write("report.md", text)
    return text


def parse_record(d: dict[str, Any]) -> dict[str, Any]:
    """A method row, or a swap (``swap``: :func:`swaps`)."""
    if isinstance(d, dict) and d.get("swap"):
        return fields_parser("rule", "ahead", "behind", "n", "beyond_noise")(d)
    return fields_parser("method", "rule", "route", "speedup", "MAL")(d)


KIND = RunKind(
    "falsify-uniform-protocol",
    parse_record,
    build_report,
    ("report.md", "table.csv"),
)
