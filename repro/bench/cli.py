"""`repro bench ...`: the benchmark commands (wired into the main app as the ``bench`` group)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from repro.errors import ConfigError

bench_app = typer.Typer(help="Kernel benchmarks: one command, one table.", no_args_is_help=True)


@bench_app.callback()
def bench() -> None:
    """Benchmarks of the GDN kernels (a group, so that its commands keep their names)."""


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--{what} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ConfigError(f"--{what} needs positive integers, got {text!r}")
    return values


@bench_app.command("kernels")
def kernels(
    out: Annotated[
        Path | None, typer.Option(help="Run folder (default results/bench-kernels-<date>).")
    ] = None,
    shapes: Annotated[
        str, typer.Option(help="Comma-separated layer shapes: weaver, specla.")
    ] = "weaver,specla",
    sizes: Annotated[
        str | None, typer.Option(help="Tree sizes T for every shape (default per shape).")
    ] = None,
    depths: Annotated[
        str | None, typer.Option(help="Accepted depths for recovery (default 2,4,8,16).")
    ] = None,
    recovery_nodes: Annotated[int, typer.Option(help="Nodes of the recovery benchmark's draft tree.")] = 128,
    bf16_precision: Annotated[
        str, typer.Option(help="tree_fused's float32 dot precision for bf16 inputs: ieee, tf32x3, tf32.")
    ] = "tf32",
    quick: Annotated[
        bool, typer.Option(help="CPU plumbing run: torch methods, tiny sizes, plain timer.")
    ] = False,
    seed: Annotated[int, typer.Option(help="Seed of trees and inputs.")] = 0,
    warmup_ms: Annotated[float, typer.Option(help="do_bench warm-up per row (ms).")] = 10.0,
    rep_ms: Annotated[float, typer.Option(help="do_bench repetitions per row, and per graph (ms).")] = 40.0,
    figures: Annotated[Path | None, typer.Option(help="Figure folder (default <out>/figures).")] = None,
    budget_s: Annotated[
        float | None, typer.Option(help="Seconds after which rows not started are recorded as skipped.")
    ] = None,
) -> None:
    """Tree verification vs per-branch / prefill / per-token-state baselines, and state recovery.

    Writes records.jsonl, manifest.json, report.md, table.csv and figures; without CUDA (or with
    --quick) only the pure-torch methods run, at tiny sizes, and the others are recorded as skipped.
    """
    import torch

    from repro.bench.kernels import QUICK_DEPTHS, QUICK_SIZES, BenchConfig, default_out_dir, run_bench
    from repro.bench.shapes import SHAPES
    from repro.bench.timing import TimerConfig

    names = [s.strip() for s in shapes.split(",") if s.strip()]
    unknown = [s for s in names if s not in SHAPES]
    if unknown or not names:
        raise ConfigError(f"unknown shape(s) {', '.join(unknown) or '(none)'}; known: {', '.join(SHAPES)}")
    cfg = BenchConfig(
        shapes=names,
        recovery_nodes=recovery_nodes,
        bf16_precision=bf16_precision,
        budget_s=budget_s,
        seed=seed,
        timer=TimerConfig(warmup_ms=warmup_ms, rep_ms=rep_ms),
    )
    cfg.quick = quick or not torch.cuda.is_available()
    if cfg.quick:
        cfg.sizes = {s: QUICK_SIZES for s in names}
        cfg.depths, cfg.recovery_nodes = QUICK_DEPTHS, min(recovery_nodes, 16)
        cfg.timer = TimerConfig(warmup_ms=min(warmup_ms, 2.0), rep_ms=min(rep_ms, 10.0))
    else:
        cfg.sizes = {s: cfg.sizes[s] for s in names}
    if sizes:
        cfg.sizes = {s: _ints(sizes, "sizes") for s in names}
    if depths:
        cfg.depths = _ints(depths, "depths")
    out_dir = out or default_out_dir()

    def show(row: dict) -> None:
        timing = f"{row['us']:.1f} us" if row["us"] is not None else row["reason"]
        typer.echo(
            f"{row['shape']:7s} {row['group']:8s} {row['kind']:5s} T={row['T']:<4d} "
            f"{row['method']:21s} {row['dtype']:4s} {row['status']:7s} {timing}",
            err=True,
        )

    table = run_bench(cfg, out_dir, figures, progress=show)
    typer.echo((out_dir / "report.md").read_text(encoding="utf-8"))
    typer.echo(f"{len(table)} rows; records, manifest, report, table and figures in {out_dir}", err=True)
