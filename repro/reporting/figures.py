"""PNG figures drawn from report tables (themselves built from records only).

Uses matplotlib's object-oriented API with the Agg canvas, so no global backend is changed and
no display is needed.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from PIL import Image

from repro.errors import ReproError

PNG_DPI = 120
PNG_COLOURS = 256  # lines and text on white: a palette PNG at ~1/3 of the RGBA one's bytes, alike to the eye


def save_png(fig: Figure, path: str | Path) -> Path:
    """``fig`` at ``path`` as a palette PNG (:data:`PNG_COLOURS` colours, :data:`PNG_DPI` dpi, tight box):
    a third of the RGBA file's bytes, which count in committed results (the whole tree travels to the GPU
    machine, docs/gpu.md)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    rgba = io.BytesIO()
    fig.savefig(rgba, format="png", dpi=PNG_DPI, bbox_inches="tight")
    rgba.seek(0)
    Image.open(rgba).convert("RGB").quantize(PNG_COLOURS).save(path, format="PNG", optimize=True)
    return path


def save_svg(fig: Figure, path: str | Path) -> Path:
    """``fig`` at ``path`` as SVG with no date and fixed element ids (matplotlib draws clip-path ids at
    random unless ``svg.hashsalt`` is set), so a rebuild writes the same file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    with matplotlib.rc_context({"svg.hashsalt": "repro"}):
        fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
    return path


def plot_acceptance(table: pd.DataFrame, path: str | Path) -> Path:
    """Speedup vs acceptance probability p, one line per (kind, width, draft length k); dashed line at 1.

    ``table`` is :func:`repro.reporting.report.acceptance_table`'s output.
    """
    if table.empty:
        raise ReproError("no synthetic_chain/synthetic_tree routes to plot speedup against acceptance")
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot()
    several_kinds = table["kind"].nunique() > 1
    for (kind, width, k), group in table.groupby(["kind", "width", "k"], sort=True, dropna=False):
        group = group.sort_values("p")
        label = f"{kind.removeprefix('synthetic_')} k={k}" if several_kinds else f"k={k}"
        if kind == "synthetic_tree" and width == width:  # not NaN
            label += f" width={width:g}"
        ax.plot(group["p"], group["speedup"], marker="o", label=label)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="AR (speedup 1)")
    ax.set_xlabel("acceptance probability p")
    ax.set_ylabel("speedup vs AR (tokens/s)")
    ax.set_title("Speedup vs acceptance probability")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return save_png(fig, path)


def plot_accept_histogram(hist: pd.DataFrame, path: str | Path) -> Path:
    """Left: share of verify steps per accepted length; right: per-position acceptance rate.

    ``hist`` is :func:`repro.reporting.report.accept_histogram`'s output (one line/bar group per route).
    """
    if hist.empty:
        raise ReproError("no verify steps to plot an accepted-length histogram")
    routes = list(dict.fromkeys(hist["route"]))
    fig = Figure(figsize=(11, 4.2))
    ax_h, ax_r = fig.subplots(1, 2)
    width = 0.8 / len(routes)
    for i, route in enumerate(routes):
        g = hist[hist["route"] == route]
        ax_h.bar(g["length"] + (i - (len(routes) - 1) / 2) * width, g["share"], width=width, label=route)
        ax_r.plot(g["length"], g["accept_rate"], marker="o", label=route)
    ax_h.set_xlabel("accepted length (incl. bonus token)")
    ax_h.set_ylabel("share of verify steps")
    ax_h.set_title("Accepted-length histogram")
    ax_r.set_xlabel("draft position d")
    ax_r.set_ylabel("fraction of steps with accepted length > d")
    ax_r.set_ylim(0, 1.02)
    ax_r.set_title("Per-position acceptance")
    for ax in (ax_h, ax_r):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    return save_png(fig, path)


def plot_depth_acceptance(curves: pd.DataFrame, path: str | Path) -> Path:
    """Per-depth acceptance vs draft depth: one panel per target, one line per route.

    ``curves`` holds one row per (target, route, depth) with its ``acceptance`` (the fraction of
    verify steps whose accepted path holds at least ``depth`` draft tokens).
    """
    if curves.empty:
        raise ReproError("no drafted routes to plot per-depth acceptance for")
    targets = list(dict.fromkeys(curves["target"]))
    fig = Figure(figsize=(5.6 * len(targets), 4.2), layout="constrained")
    for ax, target in zip(fig.subplots(1, len(targets), squeeze=False)[0], targets):
        rows = curves[curves["target"] == target]
        for route, g in rows.groupby("route", sort=False):
            ax.plot(g["depth"], g["acceptance"], marker="o", markersize=3, label=route)
        ax.set_xlabel("draft depth d")
        ax.set_ylabel("fraction of steps accepting >= d drafts")
        ax.set_ylim(0, 1.02)
        ax.set_title(target)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    return save_png(fig, path)


def plot_lines(
    curves: pd.DataFrame,
    path: str | Path,
    *,
    series: str,
    x: str,
    y: str,
    labels: tuple[str, str, str],
    ylim: tuple[float, float] | None = None,
    dashed: tuple[str, ...] = (),
) -> list[Path]:
    """One line per value of ``series`` (y against x), saved as PNG at ``path`` and as SVG beside it.

    ``labels`` are (x label, y label, title); series named in ``dashed`` are drawn dashed (bounds).
    """
    if curves.empty:
        raise ReproError(f"no rows to plot for {Path(path).name}")
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot()
    for name, g in curves.groupby(series, sort=False):
        style = "--" if str(name) in dashed else "-"
        ax.plot(g[x], g[y], linestyle=style, marker="o", markersize=3, label=str(name))
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(labels[2])
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    png = save_png(fig, path)
    return [png, save_svg(fig, png.with_suffix(".svg"))]
