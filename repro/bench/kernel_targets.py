"""The kernel targets of issues 13 and 10 judged from a `repro bench kernels` table: each met or missed, by
how much, and the floor of the row that decides it (report.md's "Kernel targets" section). Judged on the
CUDA-graph times alone (``us_graph``, ``speedup_graph``): a run without them (the CPU) judges nothing.
Nothing here measures.

- tree verification (bf16, the fastest of the project's Triton tree kernels on the bench's draft tree of
  that size, against per-branch recurrent verification of the same tree): Weaver's shape at T = 128
  <= 15 us and >= 7.1x, T = 256 <= 30 us; SpecLA's shape at T = 128 <= 15 us and >= 3x;
- chains: the project's chain verification (``chain_verify``) no slower than fla's chunk kernel
  (``chain_chunk``) at every length measured, and than per-branch recurrent at length 16; a chain's
  verification may be fla's chunk kernel itself (:data:`repro.gdn.chain.CHAIN_CHOICE`), so two times
  within :data:`TIE` of each other count as a tie (met);
- accepted-state recovery: a closed-form commit (``commit_path*`` / ``commit_closed_form*``) faster than
  token replay at every accepted depth, each row against its own like-for-like replay (``baseline``);
- issue 10's delayed commit: one layer's whole step (commit the previous step's accepted path, verify the
  new tree) with the commit folded into the verification (``step_delayed*``, the fastest) faster than the
  verification after a separate closed-form commit (``step_closed_form_fused`` / ``step_path_fused``, the
  faster) and than after token replay (``step_replay_fla``), at every accepted depth.

A missed tree time on a two-launch form says where it goes: its first launch alone (``phase1_us_graph``,
the key-only work) and the rest (the serial walk over the row blocks, and the launch between them).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

TIE = 0.02  # chains: a relative difference this small is a tie (one kernel timed twice differs by ~1%)
TREE_KERNELS = ("tree_fused", "tree_split", "tree_split_peel", "tree_blocked")  # the project's Triton forms
CLOSED_FORMS = ("commit_path", "commit_closed_form")  # method prefixes of the closed-form commits
SEPARATE_STEPS = ("step_closed_form_fused", "step_path_fused")  # verify after a separate closed-form commit


@dataclass(frozen=True)
class TreeTarget:
    """A tree-verification target at one shape and size: a time bound (us a layer) and / or a speedup
    over per-branch recurrent verification."""

    shape: str
    nodes: int
    max_us: float | None = None
    min_speedup: float | None = None


TREE_TARGETS = (
    TreeTarget("weaver", 128, max_us=15.0, min_speedup=7.1),
    TreeTarget("weaver", 256, max_us=30.0),
    TreeTarget("specla", 128, max_us=15.0, min_speedup=3.0),
)


NUMERIC = ("T", "depth", "us_graph", "speedup_graph", "floor_us", "phase1_us_graph")


def _ok(table: pd.DataFrame) -> pd.DataFrame:
    """Rows timed in CUDA graphs, their numbers as numbers (``phase1_us_graph`` NaN where a run has none)."""
    out = table.copy()
    for c in NUMERIC:
        out[c] = pd.to_numeric(out[c], errors="coerce") if c in out else float("nan")
    return out[(out["status"] == "ok") & out["us_graph"].notna()]


def _row(target: str, measured: str, verdict: str) -> str:
    return f"| {target} | {measured} | {verdict} |"


def tree_lines(ok: pd.DataFrame) -> list[str]:
    """The tree-verification targets, one line each, from the rows timed in graphs (:func:`_ok`)."""
    lines = []
    for t in TREE_TARGETS:
        here = ok[
            (ok["group"] == "verify")
            & (ok["kind"] == "draft")
            & (ok["shape"] == t.shape)
            & (ok["T"] == t.nodes)
        ]
        kernels = here[here["method"].isin(TREE_KERNELS) & (here["dtype"] == "bf16")]
        best = kernels.loc[kernels["us_graph"].idxmin()] if len(kernels) else None
        if t.max_us is not None:
            name = f"tree verify, {t.shape}, T = {t.nodes}: <= {t.max_us:g} us"
            if best is None:
                lines.append(_row(name, "not measured", "open"))
            else:
                us, floor = float(best["us_graph"]), float(best["floor_us"])
                above = f"; floor {floor:.2f} us, {us / floor:.0f}x above it" if floor > 0 else ""
                verdict = "met" if us <= t.max_us else f"missed by {us / t.max_us:.2f}x{above}{_phases(best)}"
                lines.append(_row(name, f"{us:.1f} us ({best['method']})", verdict))
        if t.min_speedup is not None:
            name = f"tree verify, {t.shape}, T = {t.nodes}: >= {t.min_speedup:g}x over per-branch"
            if best is None:
                lines.append(_row(name, "not measured", "open"))
                continue
            same_tree = here["depth"] == best["depth"]
            base = here[same_tree & (here["method"] == "per_branch_recurrent") & (here["dtype"] == "bf16")]
            if base.empty:
                lines.append(_row(name, "not measured", "open"))
            else:
                us, base_us = float(best["us_graph"]), float(base["us_graph"].iloc[0])
                ratio = base_us / us
                verdict = "met" if ratio >= t.min_speedup else f"missed: {ratio / t.min_speedup:.2f} of it"
                lines.append(_row(name, f"{ratio:.2f}x ({us:.1f} vs {base_us:.1f} us)", verdict))
    return lines


def _phases(row: pd.Series) -> str:
    """Where a two-launch form's time goes (its first launch alone, timed in graphs), or nothing."""
    first = float(row["phase1_us_graph"])
    if not first > 0:  # NaN: a one-launch form, or a run before the bench timed phases
        return ""
    rest = float(row["us_graph"]) - first
    return f"; phase 1 (key work) {first:.1f} us, phase 2 and the launch between {rest:.1f} us"


def chain_lines(ok: pd.DataFrame) -> list[str]:
    """The chain targets per shape: against fla's chunk kernel at every length, against per-branch at 16."""
    chain = ok[(ok["group"] == "chain") & (ok["dtype"] == "bf16")]
    lines = []
    for shape in _shapes(chain):
        times = chain[chain["shape"] == shape].pivot_table(index="T", columns="method", values="us_graph")
        name = f"chains, {shape}: chain_verify <= fla's chunk kernel at every length"
        if {"chain_verify", "chain_chunk"} <= set(times.columns):
            pairs = times[["chain_verify", "chain_chunk"]].dropna()
            ratio = pairs["chain_verify"] / pairs["chain_chunk"]
            measured = ", ".join(
                f"{int(n)}: {r.chain_verify:.1f} / {r.chain_chunk:.1f}" for n, r in pairs.iterrows()
            )
            slower = ratio[ratio > 1 + TIE]
            verdict = (
                "met"
                if slower.empty
                else "missed at T = " + ", ".join(f"{int(n)} ({x:.2f}x)" for n, x in slower.items())
            )
            lines.append(_row(name, measured + " us", verdict))
        else:
            lines.append(_row(name, "not measured", "open"))
        name = f"chains, {shape}: chain_verify <= per-branch recurrent at length 16"
        if {"chain_verify", "per_branch_recurrent"} <= set(times.columns) and 16 in times.index:
            mine, base = float(times.at[16, "chain_verify"]), float(times.at[16, "per_branch_recurrent"])
            verdict = "met" if mine <= base * (1 + TIE) else f"missed by {mine / base:.2f}x"
            lines.append(_row(name, f"{mine:.1f} vs {base:.1f} us", verdict))
        else:
            lines.append(_row(name, "not measured", "open"))
    return lines


def commit_lines(ok: pd.DataFrame) -> list[str]:
    """The closed-form commit against token replay at every accepted depth, per shape and tree size."""
    rec = ok[(ok["group"] == "recovery") & ok["method"].str.startswith(CLOSED_FORMS)]
    lines = []
    for shape in _shapes(rec):
        name = f"closed-form commit faster than token replay at every accepted depth, {shape}"
        mine = rec[rec["shape"] == shape]
        if mine.empty:
            lines.append(_row(name, "not measured", "open"))
        for nodes, part in mine.groupby("T"):
            best = part.loc[part.groupby("depth")["speedup_graph"].idxmax()].sort_values("depth")
            pairs = set(zip(best["method"], best["baseline"]))
            if len(pairs) == 1:  # the same pair at every depth: named once
                ((method, baseline),) = pairs
                measured = (
                    " / ".join(f"{x:.2f}" for x in best["speedup_graph"]) + "x at depth "
                    + " / ".join(str(int(d)) for d in best["depth"]) + f" ({method} vs {baseline})"
                )  # fmt: skip
            else:
                measured = ", ".join(
                    f"{r.speedup_graph:.2f}x at {int(r.depth)} ({r.method} vs {r.baseline})"
                    for r in best.itertuples()
                )
            slower = [str(int(d)) for d in best.loc[best["speedup_graph"] <= 1, "depth"]]
            verdict = "missed at depth " + ", ".join(slower) if slower else "met"
            lines.append(_row(f"{name}, T = {int(nodes)}", measured, verdict))
    return lines


def step_lines(ok: pd.DataFrame) -> list[str]:
    """Issue 10's delayed commit per shape and tree size of the step rows: the fastest delayed step against
    the fastest separate closed-form commit and against token replay, at every accepted depth."""
    step = ok[ok["group"] == "step"]
    lines = []
    for (shape, nodes), part in step.groupby(["shape", "T"], sort=False):
        times = part.pivot_table(index="depth", columns="method", values="us_graph", aggfunc="min")
        delayed = times[[m for m in times.columns if m.startswith("step_delayed")]].min(axis=1)
        separate = times[[m for m in times.columns if m in SEPARATE_STEPS]].min(axis=1)
        replay = times.get("step_replay_fla")  # None: no replay row, so nothing judged
        name = (
            f"delayed commit (issue 10), {shape}, T = {int(nodes)}: the step faster than a separate "
            "closed-form commit and than token replay, at every accepted depth"
        )
        judged = pd.DataFrame({"delayed": delayed, "separate": separate, "replay": replay}).dropna()
        if judged.empty:
            lines.append(_row(name, "not measured", "open"))
            continue
        measured = ", ".join(
            f"{int(d)}: {r.delayed:.1f} vs {r.separate:.1f} / {r.replay:.1f} us" for d, r in judged.iterrows()
        )
        slower = judged[(judged["delayed"] >= judged["separate"]) | (judged["delayed"] >= judged["replay"])]
        verdict = "missed at depth " + ", ".join(str(int(d)) for d in slower.index) if len(slower) else "met"
        lines.append(_row(name, f"depth {measured} (delayed vs separate / replay)", verdict))
    return lines


def _shapes(rows: pd.DataFrame) -> list[str]:
    """The tree targets' shapes, then any other shape of ``rows`` (a target shape without rows is listed as
    not measured)."""
    return list(dict.fromkeys([*(t.shape for t in TREE_TARGETS), *rows["shape"]]))


def target_lines(table: pd.DataFrame) -> list[str]:
    """report.md's "Kernel targets" section (heading included), or nothing for a run that judges none of
    them (no CUDA-graph times, e.g. the CPU, or none of the targets' rows)."""
    ok = _ok(table)
    if ok.empty:
        return []
    rows = tree_lines(ok) + chain_lines(ok) + commit_lines(ok) + step_lines(ok)
    missed = sum("| missed" in r for r in rows)
    met = sum(r.endswith("| met |") for r in rows)
    if not met + missed:
        return []
    return [
        "## Kernel targets of issues 13 and 10 (CUDA-graph times)",
        "",
        f"{met} met, {missed} missed, {len(rows) - met - missed} not measured in this run. "
        "A missed time says how far above the target, and the floor of its row.",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        *rows,
        "",
    ]
