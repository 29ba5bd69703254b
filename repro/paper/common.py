"""What every paper artefact shares: its run-directory kind (decode records, resumable), the papers'
numbers from ``baselines/``, the report header, the decode summary and saving a figure as PNG + SVG."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from matplotlib.figure import Figure

from repro.bench.kernels import baselines_dir
from repro.reporting.figures import save_png, save_svg
from repro.reporting.records import DecodeRecord, code_versions
from repro.reporting.report import ALL_SUITES, SUMMARY_MAIN, host_bound_lines, markdown_table, summarize
from repro.reporting.rundir import Run, RunKind

Builder = Callable[[Run, Path | None], str]


def paper_kind(name: str, report: Builder, extra_outputs: tuple[str, ...] = ()) -> RunKind:
    """A paper artefact's run-directory kind: decode records (resumable like a decode run), with
    report.md, table.csv, summary.csv and ``extra_outputs``; figures go to the figures folder."""
    return RunKind(
        name,
        DecodeRecord.from_dict,
        report,
        ("report.md", "table.csv", "summary.csv", *extra_outputs),
        key=lambda r: r.key,
        resumable=True,
        dumps=lambda r: r.to_json(),
    )


def baselines(paper: str, root: Path | None = None) -> dict[str, Any]:
    """``baselines/<paper>.yaml`` (empty when the checkout has no baselines folder)."""
    path = (root or baselines_dir()) / f"{paper}.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else {}


def header(run: Run, title: str, what: str) -> list[str]:
    m = run.manifest
    cfg = m.get("config", {})
    return [
        f"# {title}: {run.path.name}",
        "",
        what,
        "",
        f"- target {cfg.get('target')}, {cfg.get('dtype')} on {m.get('device', 'unknown')}; temperature "
        f"{cfg.get('temperature')}, max_new_tokens {cfg.get('max_new_tokens')}, limit {cfg.get('limit')}"
        " per suite",
        f"- git sha {code_versions(m)}, seed {m.get('seed')}, config hash"
        f" {str(m.get('config_hash', '?'))[:12]}, {len(run.records)} records",
        "",
    ]


PACE_COLUMNS = ["route", "tokens_per_s", "step_ms", "device_step_ms", "busy_step_ms", "wall_over_busy"]


def summary_section(run: Run) -> list[str]:
    """The decode summary (every route per suite) as markdown, and where graphs ran, each route's wall time
    a step beside its graphs' busy time (a speedup the host's pace set shows there); writes summary.csv."""
    summary = summarize(run.records)
    run.write("summary.csv", summary.to_csv(index=False))
    main = markdown_table(summary[SUMMARY_MAIN])
    lines = ["## Every route (decode summary, docs/metrics.md)", "", main, ""]
    if "wall_over_busy" in summary:
        pace = summary.loc[summary["suite"] == ALL_SUITES, PACE_COLUMNS]
        lines += [
            "### Wall time over the graphs' busy time (all suites, ms a verify step)",
            "",
            markdown_table(pace),
            "",
            "step_ms: the wall clock a verify step (decode time over launched steps), busy_step_ms: its CUDA"
            " graph replays' own time; a wall_over_busy far above 1 means the host, not the GPU, set that"
            " route's pace (per-stage times in summary.csv).",
            "",
        ]
        lines += host_bound_lines(summary)
    return lines


def save_figure(fig: Figure, folder: Path, stem: str) -> list[str]:
    """``folder/stem.png`` and ``.svg`` (no date in the SVG, so a rebuild writes the same file)."""
    save_png(fig, folder / f"{stem}.png")
    save_svg(fig, folder / f"{stem}.svg")
    return [f"{stem}.png", f"{stem}.svg"]


def figure_link(run: Run, folder: Path, stem: str, caption: str) -> str:
    try:
        rel = (folder / f"{stem}.png").resolve().relative_to(run.path.resolve())
    except ValueError:
        rel = folder / f"{stem}.png"
    return f"![{caption}]({rel})"


def fmt_ci(value: float, low: float, high: float, suffix: str = "", digits: int = 2) -> str:
    """``1.23x [1.10, 1.40]``; ``-`` for NaN; no interval when it is NaN (fewer than
    :data:`repro.reporting.stats.MIN_UNITS` prompts)."""
    if value is None or math.isnan(value):
        return "-"
    text = f"{value:.{digits}f}{suffix}"
    if not (math.isnan(low) or math.isnan(high)):
        text += f" [{low:.{digits}f}, {high:.{digits}f}]"
    return text


def pct_ci(value: float, low: float, high: float) -> str:
    """A ratio r as ``+77% [+60%, +90%]`` (r - 1 in percent)."""
    if value is None or math.isnan(value):
        return "-"
    text = f"{100 * (value - 1):+.0f}%"
    if not (math.isnan(low) or math.isnan(high)):
        text += f" [{100 * (low - 1):+.0f}%, {100 * (high - 1):+.0f}%]"
    return text


def paper_cell(ours: float, paper: float | None, suffix: str = "x") -> tuple[str, str]:
    """(the paper's number, ours / paper) as text; ``no number in baselines/`` when the paper has none."""
    if paper is None:
        return "no number in baselines/", "-"
    if math.isnan(ours):
        return f"{paper:g}{suffix}", "-"
    return f"{paper:g}{suffix}", f"{ours / paper:.2f}"


def route_methods(records: Sequence[DecodeRecord]) -> dict[str, tuple[str, str]]:
    """Per route: (kind, acceptance rule) from its resolved parameters."""
    out: dict[str, tuple[str, str]] = {}
    for r in records:
        out.setdefault(r.route, (str(r.route_params.get("kind")), str(r.route_params.get("acceptance", ""))))
    return out


def table_text(df: pd.DataFrame) -> str:
    return markdown_table(df, {c: "{}" for c in df.columns if df[c].dtype == object})
