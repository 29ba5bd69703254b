"""The figure of a ``repro bench scale`` run: is each route's speedup consistent with its MAL here?

One row of panels per shape. Left: speedup over the same shape's AR per route (bars), beside the
realised MAL (the speedup a step costing one AR step would give), the replayed target MAL and the
paper's speedup where the records state one. Right: the route's ms per verify step split by stage
(stacked), its wall step, the step the paper's speedup needs at the realised MAL (MAL x AR ms / paper)
and AR's ms per token. speedup ~ MAL x AR ms / step ms: a bar's gap to its MAL on the left is the
step's cost in AR steps on the right.

Drawn from :func:`repro.bench.scale.summary_table` alone (as :mod:`repro.reporting.figures` draws
from report tables), with the Agg canvas and no date in the file, so a rebuild writes the same bytes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from repro.errors import ReproError
from repro.reporting.figures import save_png

FIGURE = "speedup_stages.png"
STAGES = ("draft", "tree", "verify", "commit")
STAGE_COLORS = {"draft": "#4c72b0", "tree": "#dd8452", "verify": "#55a868", "commit": "#8172b3"}
SPEEDUP_COLOR, AR_COLOR, PAPER_COLOR = "#64a0c8", "#b0b0b0", "#c44e52"


def _num(value: Any) -> float:
    """A table cell as a float (NaN for None / missing)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def _ar_row(rows: pd.DataFrame) -> pd.Series | None:
    ar = rows[rows["kind"] == "ar"]
    return ar.iloc[0] if len(ar) else None


def _speedup_panel(ax: Any, rows: pd.DataFrame) -> None:
    speedup = [_num(v) for v in rows["speedup"]]
    heights = [0.0 if math.isnan(s) else s for s in speedup]
    for i, (h, kind) in enumerate(zip(heights, rows["kind"])):
        ar = kind == "ar"
        ax.bar([i], [h], width=0.6, color=AR_COLOR if ar else SPEEDUP_COLOR,
               label=None if ar else "speedup over AR (tokens/s)")  # fmt: skip
    top = max([*heights, 1.0])
    for i, (s, mal, target, paper, kind) in enumerate(
        zip(speedup, rows["MAL"], rows["target_MAL"], rows["paper_speedup"], rows["kind"])
    ):
        if not math.isnan(s):
            ax.annotate(f"{s:.2f}x", (i, s), xytext=(0, 2), textcoords="offset points", ha="center",
                        va="bottom", fontsize=7)  # fmt: skip
        if kind == "ar":
            continue
        mal, target, paper = _num(mal), _num(target), _num(paper)
        ax.plot([i], [mal], "o", mfc="none", mec="black", ms=6, label="MAL realised (= speedup at 1 AR step)")
        if not math.isnan(target) and abs(target - mal) > 1e-6:
            ax.plot([i], [target], "x", color="dimgrey", ms=5, label="MAL replayed (target)")
        if not math.isnan(paper):
            ax.plot([i], [paper], "D", color=PAPER_COLOR, ms=6, label="paper's speedup")
        top = max(top, *(v for v in (mal, target, paper) if not math.isnan(v)))
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    ax.set_ylim(0, top * 1.12)
    ax.set_ylabel("speedup over AR / MAL")


def _stage_panel(ax: Any, rows: pd.DataFrame) -> None:
    x = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for stage in STAGES:
        ms = [max(_num(v), 0.0) if not math.isnan(_num(v)) else 0.0 for v in rows[f"{stage}_ms"]]
        ax.bar(x, ms, width=0.6, bottom=bottom, color=STAGE_COLORS[stage], label=stage)
        bottom = [b + m for b, m in zip(bottom, ms)]
    step = [_num(v) for v in rows["step_ms"]]
    ar = _ar_row(rows)
    ar_step = _num(ar["step_ms"]) if ar is not None else math.nan
    ar_token = ar_step / _num(ar["MAL"]) if ar is not None else math.nan
    top = max([*bottom, *(s for s in step if not math.isnan(s))], default=1.0)
    for i, (s, mal, paper) in enumerate(zip(step, rows["MAL"], rows["paper_speedup"])):
        if math.isnan(s):
            continue
        ax.plot([i], [s], "_", color="black", ms=22, mew=2, label="step (wall)")
        if ar_step > 0:
            ax.annotate(f"{s / ar_step:.2f} AR", (i, max(s, bottom[i])), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=7)  # fmt: skip
        paper, mal = _num(paper), _num(mal)
        if not math.isnan(paper) and ar_step > 0 and paper > 0:
            need = mal * ar_step / paper
            ax.plot([i], [need], "_", color=PAPER_COLOR, ms=22, mew=2, label="step the paper's speedup needs")
            top = max(top, need)
    if ar_token > 0:
        ax.axhline(ar_token, color="black", linestyle=":", linewidth=1, label="AR ms per token")
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("ms per verify step")


def _column_legend(ax: Any, axes: list[Any]) -> None:
    """One legend for a column: every label drawn in any of its panels, once, in first-drawn order."""
    seen: dict[str, Any] = {}
    for a in axes:
        for handle, label in zip(*a.get_legend_handles_labels()):
            if isinstance(handle, Line2D) and handle.get_linestyle() == "None":  # a marker: draw it alone
                handle = Line2D(
                    [], [], linestyle="None", marker=handle.get_marker(), color=handle.get_color(),
                    mfc=handle.get_markerfacecolor(), mec=handle.get_markeredgecolor(),
                    ms=min(handle.get_markersize(), 10), mew=handle.get_markeredgewidth(),
                )  # fmt: skip
            seen.setdefault(label, handle)
    ax.legend(seen.values(), seen.keys(), fontsize="x-small", loc="best")


def plot_scale(table: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """The scale run's figure at ``path`` (PNG): one row per shape, speedup and MAL (left), ms per step by
    stage (right). ``table`` is :func:`repro.bench.scale.summary_table`'s output."""
    if table.empty:
        raise ReproError("no scale rows to plot")
    shapes = list(dict.fromkeys(table["shape"]))
    fig = Figure(figsize=(11, 0.6 + 3.4 * len(shapes)), layout="constrained")
    grid = fig.subplots(len(shapes), 2, squeeze=False)
    for (ax_s, ax_t), shape in zip(grid, shapes):
        rows = table[table["shape"] == shape].reset_index(drop=True)
        _speedup_panel(ax_s, rows)
        _stage_panel(ax_t, rows)
        ar = _ar_row(rows)
        head = shape
        if ar is not None and _num(ar["step_ms"]) > 0:
            head += f" (AR {_num(ar['step_ms']) / _num(ar['MAL']):.2f} ms per token)"
        ax_s.set_title(f"{head}: speedup", fontsize="medium")
        ax_t.set_title(f"{shape}: where a step's time goes", fontsize="medium")
        for ax in (ax_s, ax_t):
            ax.set_xticks(range(len(rows)), list(rows["route"]), rotation=20 if len(rows) > 4 else 0,
                          ha="right" if len(rows) > 4 else "center", fontsize="small")  # fmt: skip
            ax.grid(True, axis="y", alpha=0.3)
            ax.set_axisbelow(True)
    _column_legend(grid[0][0], [row[0] for row in grid])
    _column_legend(grid[0][1], [row[1] for row in grid])
    if title:
        fig.suptitle(title, fontsize="medium")
    return save_png(fig, path)
