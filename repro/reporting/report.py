"""Summaries of decode records: per-(suite, route) table, acceptance histogram, acceptance study; the
decode run's report and its run-directory kind (:data:`DECODE_KIND`).

Everything here is computed from records only; nothing is re-measured. Definitions are in
docs/metrics.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from repro.errors import ReproError
from repro.reporting import records as records_mod
from repro.reporting.records import (
    STAGES,
    DecodeRecord,
    code_versions,
    compare_to_reference,
    divergence_index,
)
from repro.reporting.rundir import DECODE, DECODE_RECORDS, Run, load_run
from repro.reporting.stats import MIN_UNITS, SPEEDUP, compare, paired_value

ALL_SUITES = "all"
SYNTHETIC_KINDS = ("synthetic_chain", "synthetic_tree")

SUMMARY_COLUMNS = [
    "suite",
    "route",
    "prompts",
    "turns",
    "new_tokens",
    "decode_s",
    "prefill_s",
    "tokens_per_s",
    "mean_tokens_per_s",
    "e2e_tokens_per_s",
    "MAL",
    "MAL_per_prompt",
    "speedup",
    "lossless",
    "temperature",
    "step_ms",
    "launched_steps",
    *(f"{s}_ms" for s in STAGES),
    "device_step_ms",
    *(f"device_{s}_ms" for s in STAGES),
    "busy_step_ms",
    *(f"busy_{s}_ms" for s in STAGES),
    "wall_over_busy",
    "host_wait_ms",
]
DEVICE_COLUMNS = ["device_step_ms", *(f"device_{s}_ms" for s in STAGES)]  # runs with device times only
BUSY_COLUMNS = ["busy_step_ms", *(f"busy_{s}_ms" for s in STAGES), "wall_over_busy"]  # runs with graphs only
WAIT_COLUMNS = ["host_wait_ms"]  # runs whose records have the host's read waits (the graphed engine) only
HISTOGRAM_COLUMNS = ["route", "length", "steps", "share", "accept_rate", "cond_accept_rate"]


def _as_records(records: Iterable[DecodeRecord | dict[str, Any]]) -> list[DecodeRecord]:
    return [r if isinstance(r, DecodeRecord) else DecodeRecord.from_dict(r) for r in records]


def _ordered_routes(records: Sequence[DecodeRecord]) -> list[str]:
    """AR routes first, then the others, each in order of first appearance."""
    seen: dict[str, bool] = {}
    for r in records:
        seen.setdefault(r.route, r.is_ar)
    return [k for k, ar in seen.items() if ar] + [k for k, ar in seen.items() if not ar]


def suites_of(records: Sequence[DecodeRecord]) -> list[str]:
    """The suites of ``records``, in first-seen order."""
    return list(dict.fromkeys(r.suite for r in records))


def reference_route(records: Sequence[DecodeRecord]) -> str | None:
    """The AR baseline route of a run: the first route whose ``route_params["kind"] == "ar"``."""
    return records_mod.reference_route((r.route, r.route_params) for r in records)


def lossless_status(records: Sequence[DecodeRecord]) -> dict[tuple[str, str, str, int], str]:
    """Per record key: "reference", "identical", "diverged at token k" or "no reference".

    Recomputed from ``output_ids`` against the reference AR record of the same (suite, prompt_id,
    turn) in the same run, so it does not depend on the order in which routes ran; an external
    loop's refusal or sampling verdict ("refused: ...", "sampled: ...") is kept as recorded.
    """
    ref = reference_route(records)
    ref_out = {(r.suite, r.prompt_id, r.turn): r.output_ids for r in records if r.route == ref}
    out = {}
    for r in records:
        if r.route == ref:
            out[r.key] = "reference"
        elif r.vs_ar.startswith(records_mod.EXTERNAL_VS_AR):
            out[r.key] = r.vs_ar
        elif (r.suite, r.prompt_id, r.turn) in ref_out:
            out[r.key] = compare_to_reference(r.output_ids, ref_out[(r.suite, r.prompt_id, r.turn)])
        else:
            out[r.key] = "no reference"
    return out


def _lossless_text(statuses: list[str]) -> str:
    if statuses and all(s == "reference" for s in statuses):
        return "reference"
    if statuses and set(statuses) == {statuses[0]} and statuses[0].startswith(records_mod.EXTERNAL_VS_AR):
        return statuses[0]  # an external loop's refusal (with its reason) or "sampled: ..."
    n = len(statuses)
    same = sum(s == "identical" for s in statuses)
    div = sum(divergence_index(s) is not None for s in statuses)
    noref = sum(s == "no reference" for s in statuses)
    other = sum(s.startswith(records_mod.EXTERNAL_VS_AR) for s in statuses)
    text = f"{same}/{n} identical"
    if div:
        text += f", {div} diverged"
    if noref:
        text += f", {noref} no reference"
    if other:
        text += f", {other} refused or sampled"
    return text


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else math.nan


def _aggregate(recs: list[DecodeRecord], statuses: dict, distinct_prompts: int) -> dict[str, Any]:
    """The token-weighted numbers of one group of records."""
    new = sum(r.new_tokens for r in recs)
    dec = sum(r.decode_s for r in recs)
    steps = sum(r.steps for r in recs)
    rates = [r.tokens_per_s for r in recs if not math.isnan(r.tokens_per_s)]
    means = [r.mean_accepted_length for r in recs if r.steps > 0]
    temps = sorted({r.temperature for r in recs})
    row: dict[str, Any] = {
        "prompts": distinct_prompts,
        "turns": len(recs),
        "new_tokens": new,
        "decode_s": dec,
        "prefill_s": sum(r.prefill_s for r in recs) / len(recs),
        "tokens_per_s": _ratio(new, dec),
        "mean_tokens_per_s": sum(rates) / len(rates) if rates else math.nan,
        "e2e_tokens_per_s": _ratio(new, dec + sum(r.prefill_s for r in recs)),
        "MAL": _ratio(sum(sum(r.accepted_lengths) for r in recs), steps),
        "MAL_per_prompt": sum(means) / len(means) if means else math.nan,
        "lossless": _lossless_text([statuses[r.key] for r in recs]),
        "temperature": temps[0] if len(temps) == 1 else "mixed",
        "step_ms": 1000 * _ratio(dec, steps),
        "launched_steps": sum(r.steps if r.launched_steps is None else r.launched_steps for r in recs),
    }
    timed = not any(
        records_mod.is_external_route(r.route_params) for r in recs
    )  # no stages inside others' loops
    for s in STAGES:
        row[f"{s}_ms"] = (
            1000 * _ratio(sum(float(r.stage_s.get(s, 0.0)) for r in recs), steps) if timed else math.nan
        )
    with_device = [r for r in recs if r.device_stage_s is not None]  # records before device times: none
    device_steps = sum(r.steps for r in with_device) if len(with_device) == len(recs) else 0
    for s in STAGES:
        total = sum(float(r.device_stage_s.get(s, 0.0)) for r in with_device if r.device_stage_s)
        row[f"device_{s}_ms"] = 1000 * _ratio(total, device_steps)
    row["device_step_ms"] = sum(row[f"device_{s}_ms"] for s in STAGES)
    with_busy = [r.busy_stage_s for r in recs if r.busy_stage_s is not None]
    busy_steps = steps if len(with_busy) == len(recs) else 0  # all or none: no partial sums
    for s in STAGES:
        row[f"busy_{s}_ms"] = 1000 * _ratio(sum(float(b.get(s, 0.0)) for b in with_busy), busy_steps)
    row["busy_step_ms"] = sum(row[f"busy_{s}_ms"] for s in STAGES)
    row["wall_over_busy"] = _ratio(row["step_ms"], row["busy_step_ms"])
    waits = [r.host_wait_s for r in recs if r.host_wait_s is not None]
    row["host_wait_ms"] = 1000 * _ratio(sum(waits), steps if len(waits) == len(recs) else 0)
    return row


def paired_speedups(records: Iterable[DecodeRecord | dict[str, Any]]) -> pd.DataFrame:
    """Each non-reference route's speedup over the run's AR route, paired per prompt, with its
    percentile-bootstrap 95% CI (:func:`repro.reporting.stats.compare`): one row per suite and one pooling
    every suite's prompts (``all (pooled)``, each prompt weighted by its tokens); each point estimate equals
    the summary's speedup. Empty without an AR route."""
    recs = _as_records(records)
    ref = reference_route(recs)
    rows: list[dict[str, Any]] = []
    if ref is None:
        return pd.DataFrame(columns=PAIRED_COLUMNS)
    suites = suites_of(recs)
    for route in _ordered_routes(recs):
        if route == ref:
            continue
        held = {r.suite for r in recs if r.route == route}
        for name, chosen in [*((s, [s]) for s in suites if s in held), (f"{ALL_SUITES} (pooled)", suites)]:
            paired = compare(recs, route, ref, chosen, SPEEDUP)
            if paired.n:
                rows.append({"suite": name, "route": route, "prompts": paired.n, "speedup": paired.value,
                             "ci_low": paired.low, "ci_high": paired.high})  # fmt: skip
    return pd.DataFrame(rows, columns=PAIRED_COLUMNS)


PAIRED_COLUMNS = ["suite", "route", "prompts", "speedup", "ci_low", "ci_high"]


def summarize(records: Iterable[DecodeRecord | dict[str, Any]]) -> pd.DataFrame:
    """One row per (suite, route), plus a suite "all" row per route; columns SUMMARY_COLUMNS
    (DEVICE_COLUMNS only when some record has device stage times, BUSY_COLUMNS only when some record has
    graph busy times, so older runs rebuild as they were).

    speedup = route tokens/s / AR tokens/s in the same suite of the same run, over the
    (prompt_id, turn) pairs both have (:func:`repro.reporting.stats.paired_value`); the "all" row pools
    every suite's pairs (token-weighted), as its other numbers pool all the route's records.
    """
    recs = _as_records(records)
    if not recs:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    statuses = lossless_status(recs)
    ref = reference_route(recs)
    suites = suites_of(recs)
    rows = []
    for route in _ordered_routes(recs):
        mine = [r for r in recs if r.route == route]
        for suite in suites:
            group = [r for r in mine if r.suite == suite]
            if not group:
                continue
            row = {
                "suite": suite,
                "route": route,
                **_aggregate(group, statuses, len({r.prompt_id for r in group})),
            }
            row["speedup"] = paired_value(recs, route, ref, [suite], SPEEDUP)
            rows.append(row)
        row = {
            "suite": ALL_SUITES,
            "route": route,
            **_aggregate(mine, statuses, len({(r.suite, r.prompt_id) for r in mine})),
        }
        row["speedup"] = paired_value(recs, route, ref, suites, SPEEDUP)  # every suite's prompts pooled
        rows.append(row)
    hidden = set() if any(r.device_stage_s is not None for r in recs) else set(DEVICE_COLUMNS)
    if not any(r.busy_stage_s is not None for r in recs):
        hidden |= set(BUSY_COLUMNS)
    if all(r.launched_steps is None for r in recs):  # every step recorded: the column says nothing
        hidden.add("launched_steps")
    if all(r.host_wait_s is None for r in recs):
        hidden |= set(WAIT_COLUMNS)
    df = pd.DataFrame(rows, columns=[c for c in SUMMARY_COLUMNS if c not in hidden])
    suite_order = {s: i for i, s in enumerate([*suites, ALL_SUITES])}
    df["_order"] = df["suite"].map(suite_order)
    return df.sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)


BOUND_COLUMNS = [
    "route", "prompts", "MAL", "busy_step_ms", "speedup", "graphs_speedup", "free_draft", "verify_only"
]  # fmt: skip


def speedup_bounds(summary: pd.DataFrame) -> pd.DataFrame:
    """What the graphs allow, per route (suite "all" rows of :func:`summarize` with busy times), against the
    reference route's busy time per token (AR: a step is a token): ``graphs_speedup`` = MAL x AR busy /
    the route's busy step (both paced by their graphs alone, no host time), ``free_draft`` the same with
    the draft and tree stages free, ``verify_only`` with only the verify stage left (drafting, acceptance
    and commit free): the ceiling a faster host path or drafter could reach at this MAL. Empty without
    busy times or a reference route."""
    if "busy_step_ms" not in summary or summary.empty:
        return pd.DataFrame(columns=BOUND_COLUMNS)
    rows = summary[summary["suite"] == ALL_SUITES]
    ref = rows[rows["lossless"] == "reference"]
    if ref.empty or not ref.iloc[0]["busy_step_ms"] > 0:
        return pd.DataFrame(columns=BOUND_COLUMNS)
    ar_ms = float(ref.iloc[0]["busy_step_ms"]) / float(ref.iloc[0]["MAL"])  # per token
    out = []
    for _, r in rows[rows["lossless"] != "reference"].iterrows():
        mal = float(r["MAL"])
        parts = {
            "graphs_speedup": float(r["busy_step_ms"]),
            "free_draft": float(r["busy_verify_ms"] + r["busy_commit_ms"]),
            "verify_only": float(r["busy_verify_ms"]),
        }
        bounds = {k: _ratio(mal * ar_ms, v) for k, v in parts.items()}
        out.append({"route": r["route"], "prompts": int(r["prompts"]), "MAL": mal,
                    "busy_step_ms": float(r["busy_step_ms"]), "speedup": r["speedup"], **bounds})  # fmt: skip
    return pd.DataFrame(out, columns=BOUND_COLUMNS)


HOST_BOUND = 1.5  # wall time a step over the graphs' busy time above which the host set a route's pace


def host_bound(summary: pd.DataFrame) -> list[tuple[str, float]]:
    """(route, wall_over_busy) of the routes whose wall time a step (suite "all" rows of :func:`summarize`)
    is above :data:`HOST_BOUND` x their graphs' busy time: their tokens/s time the host, not the GPU, and a
    speedup over such a reference is not a GPU speedup. Empty without busy times."""
    if "wall_over_busy" not in summary:
        return []
    rows = summary[(summary["suite"] == ALL_SUITES) & (summary["wall_over_busy"] > HOST_BOUND)]
    return [(str(r.route), float(r.wall_over_busy)) for r in rows.itertuples(index=False)]


def host_bound_lines(summary: pd.DataFrame) -> list[str]:
    """The report line naming the :func:`host_bound` routes (none when there are none)."""
    slow = host_bound(summary)
    if not slow:
        return []
    named = ", ".join(f"{route} ({ratio:.2f})" for route, ratio in slow)
    return [
        f"**Host-bound** (wall over busy above {HOST_BOUND}): {named}: their tokens/s time the host, not the"
        " GPU, and speedups over or of them are not GPU speedups.",
        "",
    ]


OUTSIDE_COLUMNS = ["route", "turns", "outside_us", "over_2x", "over_2x_at", "worst_turn", "worst_us"]


def outside_graphs(records: Sequence[DecodeRecord]) -> pd.DataFrame:
    """Per route, the device time of a verify step outside its graph replays (a turn's stage-mark device
    time minus its replays' busy time, per launched step, in us): the median over the route's turns, the
    number of turns above twice that median (where the host fell behind) and their places among the route's
    turns in run order (the records' order; 1 = its first), and the worst turn. Only turns with busy times;
    empty without any."""
    rows = []
    for route in _ordered_routes(records):
        turns = []
        for r in records:
            steps = r.steps if r.launched_steps is None else r.launched_steps
            if r.route != route or not r.busy_stage_s or not r.device_stage_s or not steps:
                continue
            outside = sum(r.device_stage_s.values()) - sum(r.busy_stage_s.values())
            turns.append((1e6 * outside / steps, f"{r.suite}/{r.prompt_id} turn {r.turn}"))
        if not turns:
            continue
        median = float(pd.Series([us for us, _ in turns]).median())
        worst_us, worst = max(turns)
        late = [str(i) for i, (us, _) in enumerate(turns, 1) if us > 2 * median]
        rows.append({"route": route, "turns": len(turns), "outside_us": median, "over_2x": len(late),
                     "over_2x_at": ", ".join(late) or "-", "worst_turn": worst,
                     "worst_us": worst_us})  # fmt: skip
    return pd.DataFrame(rows, columns=OUTSIDE_COLUMNS)


def accept_histogram(records: Iterable[DecodeRecord | dict[str, Any]]) -> pd.DataFrame:
    """Per route and accepted length L = 1..max: step count, share, and acceptance per draft position.

    ``accept_rate`` at L = d is the fraction of steps with accepted length > d, i.e. whose d-th
    draft token was accepted; ``cond_accept_rate`` is that fraction among the steps that reached
    position d (accepted length >= d).
    """
    recs = _as_records(records)
    rows = []
    for route in _ordered_routes(recs):
        lengths = [a for r in recs if r.route == route for a in r.accepted_lengths]
        if not lengths:
            continue
        n = len(lengths)
        for d in range(1, max(lengths) + 1):
            reached = sum(a >= d for a in lengths)
            beyond = sum(a > d for a in lengths)
            rows.append(
                {
                    "route": route,
                    "length": d,
                    "steps": sum(a == d for a in lengths),
                    "share": sum(a == d for a in lengths) / n,
                    "accept_rate": beyond / n,
                    "cond_accept_rate": _ratio(beyond, reached),
                }
            )
    return pd.DataFrame(rows, columns=HISTOGRAM_COLUMNS)


# ------------------------------------------------------------------------- acceptance study


def acceptance_table(records: Iterable[DecodeRecord | dict[str, Any]]) -> pd.DataFrame:
    """Controlled acceptance study: one row per synthetic route, sorted by (kind, width, k, p).

    Columns: kind, width (chains 1, trees their route parameter or NaN), k, p, route, MAL,
    MAL_iid (chains only: (1 - p^(k+1)) / (1 - p), the MAL if every draft token is accepted
    independently with probability p), MAL_per_prompt, tokens_per_s (from the route's "all" row of
    :func:`summarize`), speedup over AR paired per prompt, every suite's prompts pooled, with its
    percentile-bootstrap 95% CI (ci_low, ci_high) and n prompts (:func:`repro.reporting.stats.compare`),
    step_ms and verify_ms (the "all" row's).
    """
    recs = _as_records(records)
    copied = ["MAL", "MAL_per_prompt", "tokens_per_s", "step_ms", "verify_ms"]
    columns = ["kind", "width", "k", "p", "route", "MAL", "MAL_iid", "MAL_per_prompt", "tokens_per_s"]
    columns += ["speedup", "ci_low", "ci_high", "n", "step_ms", "verify_ms"]
    params = {r.route: r.route_params for r in recs}
    synth = {route: rp for route, rp in params.items() if rp.get("kind") in SYNTHETIC_KINDS}
    if not synth:
        return pd.DataFrame(columns=columns)
    for route, rp in synth.items():
        if "p" not in rp or "k" not in rp:
            raise ReproError(f"route {route} of kind {rp['kind']} lacks its 'p' or 'k' route parameter")
    summary = summarize(recs)
    overall = summary[summary["suite"] == ALL_SUITES].set_index("route")
    ref = reference_route(recs)
    suites = suites_of(recs)
    rows = []
    for route, rp in synth.items():
        p, k = float(rp["p"]), int(rp["k"])
        chain = rp["kind"] == "synthetic_chain"
        mal_iid = math.nan
        if chain:
            mal_iid = float(k + 1) if p == 1 else (1 - p ** (k + 1)) / (1 - p)
        width = 1.0 if chain else float(rp.get("width", math.nan))
        s = overall.loc[route]
        paired = compare(recs, route, ref, suites, SPEEDUP) if ref is not None else None
        rows.append(
            {
                "kind": rp["kind"],
                "width": width,
                "k": k,
                "p": p,
                "route": route,
                "MAL_iid": mal_iid,
                **{c: s[c] for c in copied},
                "speedup": paired.value if paired else math.nan,
                "ci_low": paired.low if paired else math.nan,
                "ci_high": paired.high if paired else math.nan,
                "n": paired.n if paired else 0,
            }
        )
    return pd.DataFrame(rows, columns=columns).sort_values(["kind", "width", "k", "p"], ignore_index=True)


def break_even_p(
    table: pd.DataFrame, kind: str | None = None, width: float | None = None
) -> dict[int, float | None]:
    """Per draft length k: the smallest p with speedup >= 1, interpolated linearly between grid points.

    Scans p upwards; at the first grid point with speedup >= 1 the crossing is interpolated from
    the previous grid point (the first grid point itself when it already reaches 1). None when no
    grid point reaches 1 (or every speedup is NaN). ``kind`` and ``width`` select rows; they are
    required when the table holds several kinds, or several tree widths for one k.
    """
    if kind is not None:
        table = table[table["kind"] == kind]
    elif "kind" in table and table["kind"].nunique() > 1:
        raise ValueError("the table holds several route kinds; pass kind=")
    if width is not None:
        table = table[table["width"] == width]
    out: dict[int, float | None] = {}
    for k, group in table.groupby("k", sort=True):
        if "width" in group and group["width"].nunique(dropna=False) > 1:
            raise ValueError(f"the table holds several tree widths for k={k}; pass width=")
        grid = group.sort_values("p")[["p", "speedup"]].itertuples(index=False)
        pts = [(float(p), float(s)) for p, s in grid if not math.isnan(s)]
        out[int(k)] = None
        for i, (p, s) in enumerate(pts):
            if s >= 1:
                if i == 0:
                    out[int(k)] = p
                else:
                    p0, s0 = pts[i - 1]
                    out[int(k)] = p0 + (1 - s0) * (p - p0) / (s - s0)
                break
    return out


# ---------------------------------------------------------------------------------- markdown

_FORMATS = {
    "decode_s": "{:.3f}",
    "prefill_s": "{:.4f}",
    "tokens_per_s": "{:.1f}",
    "mean_tokens_per_s": "{:.1f}",
    "e2e_tokens_per_s": "{:.1f}",
    "MAL": "{:.2f}",
    "MAL_per_prompt": "{:.2f}",
    "MAL_iid": "{:.2f}",
    "speedup": "{:.2f}x",
    "ci_low": "{:.2f}x",
    "ci_high": "{:.2f}x",
    "share": "{:.3f}",
    "accept_rate": "{:.3f}",
    "cond_accept_rate": "{:.3f}",
    "p": "{:g}",
    "temperature": "{:g}",
    "step_ms": "{:.2f}",
    **{f"{s}_ms": "{:.2f}" for s in STAGES},
    "device_step_ms": "{:.2f}",
    **{f"device_{s}_ms": "{:.2f}" for s in STAGES},
    "busy_step_ms": "{:.3f}",
    **{f"busy_{s}_ms": "{:.3f}" for s in STAGES},
    "wall_over_busy": "{:.2f}",
    "host_wait_ms": "{:.3f}",
    "graphs_speedup": "{:.2f}x",
    "free_draft": "{:.2f}x",
    "verify_only": "{:.2f}x",
}
SUMMARY_MAIN = [
    "suite",
    "route",
    "prompts",
    "turns",
    "new_tokens",
    "tokens_per_s",
    "speedup",
    "MAL",
    "MAL_per_prompt",
    "lossless",
    "temperature",
]
SUMMARY_TIMING = [
    "suite",
    "route",
    "decode_s",
    "prefill_s",
    "mean_tokens_per_s",
    "e2e_tokens_per_s",
    "step_ms",
    "launched_steps",
    *(f"{s}_ms" for s in STAGES),
    "device_step_ms",
]

SUMMARY_DEVICE = ["suite", "route", "step_ms", *DEVICE_COLUMNS]  # + BUSY_COLUMNS where records have them


def _cell(value: Any, fmt: str | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return (fmt or "{:.3g}").format(value) if not value.is_integer() or fmt else str(int(value))
    if isinstance(value, int):
        return (fmt or "{}").format(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(df: pd.DataFrame, formats: dict[str, str] | None = None) -> str:
    """A GitHub-flavoured markdown table; NaN/None as "-", numbers right-aligned."""
    formats = {**_FORMATS, **(formats or {})}
    header = [str(c) for c in df.columns]
    body = [
        [
            _cell(v.item() if hasattr(v, "item") else v, formats.get(str(c)))
            for c, v in zip(df.columns, row, strict=True)
        ]
        for row in df.itertuples(index=False)
    ]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(header)]

    cols = list(zip(widths, numeric, strict=True))

    def line(cells: list[str]) -> str:
        padded = [c.rjust(w) if num else c.ljust(w) for c, (w, num) in zip(cells, cols, strict=True)]
        return "| " + " | ".join(padded) + " |"

    rules = [("-" * (w + 1) + ":") if num else ("-" * (w + 2)) for w, num in cols]
    sep = "|" + "|".join(rules) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in body)])


_DEFINITIONS = """\
- accepted length: tokens committed by one verify step, including the bonus token (AR: 1).
- MAL: token-weighted, sum of accepted lengths / sum of verify steps. MAL_per_prompt: mean over
  records (prompt turns) of each record's mean accepted length (DFlash/DDTree convention).
- tokens_per_s: sum of new tokens / sum of decode seconds (prefill excluded; the first new token
  comes from prefill). mean_tokens_per_s: mean of per-record rates. e2e_tokens_per_s includes
  prefill. prefill_s: mean per record.
- speedup: tokens_per_s / the AR route's tokens_per_s in the same suite of this run, over the
  prompt turns both routes have; suite "all": the same over every suite's turns pooled (token-weighted,
  as the other columns pool all records; before 2026-12-05 it was the mean of the suites' speedups).
- lossless: sha256 of generated token ids per prompt turn compared with the AR route's;
  "diverged at token k" gives the first differing 0-based index. Sampling draws are keyed by
  (the run's seed and the prompt, output position), so target-sample-then-match routes must match AR
  at any temperature; rules that accept by draft probabilities are lossless in distribution only.
- step_ms, draft/tree/verify/commit_ms: decode and stage seconds per verify step, in ms (wall clock).
  device_step_ms: the stages' device time per verify step (CUDA events at the stage boundaries,
  summed; CPU: the wall-clock stage times; "-" for records made before device times were kept).
  On the graphed engine's greedy path no stage boundary synchronizes, so step_ms vs device_step_ms
  is the harness overhead, and the wall-clock stage columns are the host's split (its one wait, at
  the step's read, lands in commit): the device's split is the device_*_ms table. Device time counts
  the device's idle gaps too (an event on an idle stream completes at once).
- busy_step_ms, busy_*_ms: the CUDA graphs' busy time per verify step: every graph replay of the decode
  loop between two events, summed into the stage it ran in (a replay on an idle stream counts its
  launch latency too). wall_over_busy = step_ms / busy_step_ms: how much longer a step takes than its
  graphs run (1 = the host keeps the device busy); "-" or absent where no graph ran (CPU, graphs off).
- per-position acceptance (histogram): accept_rate at length d = fraction of steps with accepted
  length > d (the d-th draft token accepted); cond_accept_rate = the same among steps with
  accepted length >= d.
- definitions in full: docs/metrics.md."""


def _histogram_tables(hist: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    counts = hist.pivot(index="route", columns="length", values="steps").fillna(0).astype(int)
    rates = hist.pivot(index="route", columns="length", values="accept_rate")
    order = list(dict.fromkeys(hist["route"]))
    counts, rates = counts.loc[order], rates.loc[order]
    counts.columns = [f"L={c}" for c in counts.columns]
    rates.columns = [f"pos {c}" for c in rates.columns]
    return counts.reset_index(), rates.reset_index()


def write_report(run_dir: str | Path, figures: bool = True) -> str:
    """Rebuild a decode run's report from its records (see :func:`build_report`); returns the markdown."""
    run = load_run(run_dir, {DECODE: DECODE_KIND})
    return build_report(run, run.path if figures else None)


def _captures_section(records: Sequence[DecodeRecord]) -> list[str]:
    """Report lines on the records whose timed decode captured CUDA graphs (none: no lines)."""
    hit = [r for r in records if r.graph_captures]
    if not hit:
        return []
    lines = ["## Graphs captured inside the timed decode", ""]
    for route in _ordered_routes(hit):
        recs = [r for r in hit if r.route == route]
        captures = sum(r.graph_captures or 0 for r in recs)
        lines.append(f"- {route}: {captures} capture(s) in {len(recs)} record(s)")
    lines += [
        "",
        "Their warm-up calls and capture are in these records' decode time (tok/s too low, wall_over_busy"
        " too high): a graph first needed after the warm-up turns (a new tree slot, drafter buffer or"
        " buffer growth). More warm-up turns (`warmup:`) or a longer first turn take them out.",
        "",
    ]
    return lines


def switches_text(values: dict[str, Any]) -> str:
    """A run's engine switches as a report shows them: ``fuse_accept=false, ar_group=2``."""
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in values.items())


def build_report(run: Run, figures_dir: Path | None) -> str:
    """report.md, summary.csv and histogram.csv (and figures) of a decode run, from its records only.

    With synthetic routes also acceptance.csv and the break-even p per draft length. Figures
    (accept_histogram.png, acceptance.png, inside the run directory) are drawn unless ``figures_dir``
    is None, and skipped with a note when there is no verify step to plot. Returns the markdown.
    """
    run_dir, manifest, records = run.path, run.manifest, run.records
    summary = summarize(records)
    hist = accept_histogram(records)
    acc = acceptance_table(records)
    run.write("summary.csv", summary.to_csv(index=False))
    run.write("histogram.csv", hist.to_csv(index=False))

    lines = [f"# Run report: {run_dir.name}", ""]
    lines += [
        f"- device: {manifest.get('device', 'unknown')}",
        f"- git sha: {code_versions(manifest)}",
        f"- repro {manifest.get('repro_version', '?')}, seed {manifest.get('seed')},"
        f" config hash {str(manifest.get('config_hash', '?'))[:12]}",
        f"- created {manifest.get('created_at', '?')}, updated {manifest.get('updated_at', '?')},"
        f" {len(records)} records",
    ]
    switches = {k: v for k, v in (manifest.get("repro_env") or {}).items() if k != "REPRO_GIT_SHA"}
    if switches:
        lines.append("- REPRO_* switches set: " + ", ".join(f"{k}={v}" for k, v in switches.items()))
    if engine := (manifest.get("config") or {}).get("switches"):
        lines.append(f"- engine switches set: {switches_text(engine)}")
    lines.append("")
    if not records:
        lines += ["No records yet.", ""]
    else:
        lines += [
            "## Summary",
            "",
            markdown_table(summary[SUMMARY_MAIN]),
            "",
        ]
        paired = paired_speedups(records)
        if not paired.empty:
            lines += [
                "## Speedup over AR, paired per prompt (95% percentile bootstrap CI)",
                "",
                markdown_table(paired),
                "",
                "prompts: the prompts both routes decoded (MT-Bench's turns pooled per prompt); no interval"
                f" below {MIN_UNITS} prompts. all (pooled): every suite's prompts together, token-weighted.",
                "",
            ]
        lines += [
            "## Timing (decode and stage time per verify step)",
            "",
            markdown_table(summary[[c for c in SUMMARY_TIMING if c in summary]]),
            "",
        ]
        if set(SUMMARY_DEVICE) <= set(summary.columns):
            busy = [c for c in BUSY_COLUMNS if c in summary]
            waits = [c for c in WAIT_COLUMNS if c in summary and busy]
            lines += [
                "## Device time per stage (CUDA events at the stage marks, ms per verify step)",
                "",
                markdown_table(summary[SUMMARY_DEVICE + busy + waits]),
                "",
            ]
            if busy:
                wait_text = (
                    " host_wait_ms: the host's time a step waiting for a result not on the host yet (the"
                    " host ahead of the device); near zero, the host paces the loop and the device waits"
                    " between its graphs instead."
                    if waits
                    else ""
                )
                lines += [
                    "busy_*: the CUDA graph replays' own time in each stage; wall_over_busy = step_ms /"
                    " busy_step_ms, how much longer a step takes than its graphs run." + wait_text,
                    "",
                    *host_bound_lines(summary),
                ]
                bounds = speedup_bounds(summary)
                if not bounds.empty:
                    lines += [
                        "## What the graphs allow (all suites; over the reference's busy time a token)",
                        "",
                        markdown_table(bounds),
                        "",
                        "prompts: the prompts the route decoded (n); graphs_speedup ="
                        " MAL x reference busy ms a token / busy_step_ms (host time free);"
                        " free_draft: the draft and tree stages free too; verify_only: only the verify stage"
                        " left (drafting, acceptance and commit free): the ceiling at this MAL.",
                        "",
                    ]
                outside = outside_graphs(records)
                if not outside.empty:
                    lines += [
                        "## Outside the graphs (device time a verify step not in a graph replay, us)",
                        "",
                        markdown_table(outside, {"outside_us": "{:.1f}", "worst_us": "{:.1f}"}),
                        "",
                        "outside_us: a turn's stage-mark device time minus its graph replays' busy time, per"
                        " launched step (eager launches, graph boundaries, the engine's own events, and the"
                        " device idle while the host catches up), the median over the route's turns;"
                        " over_2x: the turns above twice that median (there the host fell behind), over_2x_at"
                        " their places among the route's turns in run order (1: its first), the worst named.",
                        "",
                    ]
        lines += _captures_section(records)
        counts, rates = _histogram_tables(hist)
        lines += [
            "## Accepted lengths (verify steps per accepted length)",
            "",
            markdown_table(counts),
            "",
            "## Per-position acceptance (fraction of steps with accepted length > d)",
            "",
            markdown_table(rates),
            "",
        ]
        statuses = lossless_status(records)
        diverged = [(r, statuses[r.key]) for r in records if divergence_index(statuses[r.key]) is not None]
        if diverged:
            lines += ["## Divergences from AR", ""]
            lines += [
                f"- {r.route} / {r.suite} / {r.prompt_id} turn {r.turn} (T={r.temperature:g}): {s}"
                for r, s in diverged[:30]
            ]
            if len(diverged) > 30:
                lines.append(f"- ... and {len(diverged) - 30} more")
            lines.append("")
        if not acc.empty:
            run.write("acceptance.csv", acc.to_csv(index=False))
            lines += ["## Controlled acceptance study", "", markdown_table(acc), ""]
            for (kind, width), rows in acc.groupby(["kind", "width"], sort=False, dropna=False):
                lowest = rows.groupby("k")["p"].min()
                parts = []
                label = kind if kind == "synthetic_chain" or math.isnan(width) else f"{kind}, width {width:g}"
                for k, p in break_even_p(rows, kind=kind).items():
                    if p is None:
                        parts.append(f"k={k}: not reached on the grid")
                    else:  # at the lowest grid point the crossing lies at or below it
                        parts.append(f"k={k}: p {'<=' if p == lowest[k] else '='} {p:.3f}")
                lines.append(f"- break-even p ({label}, speedup 1): {'; '.join(parts)}")
            lines.append("")
        if figures_dir is not None and hist.empty:
            lines += ["Figures skipped: no verify steps to plot (every output stopped after one token).", ""]
        elif figures_dir is not None:
            from repro.reporting.figures import plot_accept_histogram, plot_acceptance

            plot_accept_histogram(hist, run_dir / "accept_histogram.png")
            run.written.append("accept_histogram.png")
            lines += ["![accepted lengths](accept_histogram.png)", ""]
            if not acc.empty:
                plot_acceptance(acc, run_dir / "acceptance.png")
                run.written.append("acceptance.png")
                lines += ["![speedup vs acceptance probability](acceptance.png)", ""]
    lines += ["## Metric definitions", "", _DEFINITIONS, ""]
    text = "\n".join(lines)
    run.write("report.md", text)
    return text


DECODE_KIND = dataclasses.replace(DECODE_RECORDS, report=build_report)
"""The decode run kind: decode records, resumable, with :func:`build_report` as its report."""
