"""`repro bench ...`: the benchmark commands (wired into the main app as the ``bench`` group)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from repro.errors import CheckFailed, ConfigError
from repro.models.config import HybridConfig
from repro.options import (
    comma_ints,
    comma_list,
    device_option,
    dtype_option,
    figure_folder,
    shape_names,
    short_dtype,
)
from repro.progress import Progress
from repro.tree import MAX_TREE_NODES

bench_app = typer.Typer(help="Kernel and model benchmarks: one command, one table.", no_args_is_help=True)


@bench_app.callback()
def bench() -> None:
    """Benchmarks of the GDN kernels and of whole models (a group, so that its commands keep their names)."""


def _check_fits(shape: str, config: HybridConfig, tokens: int, what: str) -> None:
    """A sequence of ``tokens`` fits the shape's context capacity, else a one-line ConfigError."""
    if tokens > config.context_capacity:
        raise ConfigError(f"{what} is {tokens:,} tokens; the {shape} shape holds {config.context_capacity:,}")


def _real_shapes_need_cuda(names: list[str], dev) -> None:
    """The papers' shapes (billions of parameters) run only on CUDA: elsewhere they exhaust memory or take
    hours; the tiny shape runs anywhere."""
    real = [n for n in names if n != "tiny"]
    if dev.type != "cuda" and real:
        raise ConfigError(
            f"shape(s) {', '.join(real)} are real model sizes and need a CUDA GPU;"
            f" on {dev.type} use the tiny shape"
        )


@bench_app.command("kernels")
def kernels(
    out: Annotated[
        Path | None, typer.Option(help="Run folder (default results/bench-kernels-<date>).")
    ] = None,
    shapes: Annotated[
        str, typer.Option(help="Comma-separated layer shapes: weaver, specla, tiny-qwen35.")
    ] = "weaver,specla",
    sizes: Annotated[
        str | None, typer.Option(help="Tree sizes T and chain lengths for every shape (default per shape).")
    ] = None,
    depths: Annotated[
        str | None, typer.Option(help="Accepted depths for recovery (default 1,2,4,8,16).")
    ] = None,
    recovery_nodes: Annotated[
        int, typer.Option(min=2, help="Nodes of the recovery benchmark's draft tree.")
    ] = 128,
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
    time_budget: Annotated[
        float | None,
        typer.Option(
            help="Seconds after which rows not started are recorded as skipped; shared evenly by the "
            "(row group, shape) blocks (each may use what the blocks before it left)."
        ),
    ] = None,
    groups: Annotated[
        str | None, typer.Option(help="Only these row groups: verify, recovery, step, chain (default all).")
    ] = None,
    methods: Annotated[
        str | None, typer.Option(help="Only these methods (each block's baseline stays; default all).")
    ] = None,
    device: Annotated[
        str, device_option("auto (CUDA when present), cpu (same as --quick) or cuda.")
    ] = "auto",
) -> None:
    """Tree verification vs per-branch / prefill / per-token-state baselines, and state recovery.

    Writes records.jsonl, manifest.json, report.md, table.csv and figures; without CUDA (or with
    --quick) only the pure-torch methods run, at tiny sizes, and the others are recorded as skipped.
    """
    from repro.bench.kernels import (
        QUICK_DEPTHS,
        QUICK_SIZES,
        BenchConfig,
        check_selection,
        default_out_dir,
        plan,
        run_bench,
    )
    from repro.bench.shapes import SHAPES
    from repro.bench.timing import TimerConfig
    from repro.models.target import resolve_device

    figure_folder(figures)
    names = shape_names(shapes, SHAPES)
    chosen_groups = comma_list(groups) if groups else None
    chosen_methods = comma_list(methods) if methods else None
    check_selection(chosen_groups, chosen_methods)
    cfg = BenchConfig(
        shapes=names,
        groups=chosen_groups,
        methods=chosen_methods,
        recovery_nodes=recovery_nodes,
        bf16_precision=bf16_precision,
        budget_s=time_budget,
        seed=seed,
        timer=TimerConfig(warmup_ms=warmup_ms, rep_ms=rep_ms),
    )
    check_budget(time_budget)
    if bf16_precision not in ("ieee", "tf32x3", "tf32"):
        raise ConfigError(f"--bf16-precision must be ieee, tf32x3 or tf32, got {bf16_precision!r}")
    on_cuda = resolve_device(device).startswith("cuda")  # checked with --quick too
    cfg.quick = quick or not on_cuda
    if cfg.quick:
        cfg.sizes = {s: QUICK_SIZES for s in names}
        cfg.depths, cfg.recovery_nodes = QUICK_DEPTHS, min(recovery_nodes, 16)
        cfg.timer = TimerConfig(warmup_ms=min(warmup_ms, 2.0), rep_ms=min(rep_ms, 10.0))
    else:
        cfg.sizes = {s: cfg.sizes[s] for s in names}
    if sizes:
        cfg.sizes = {s: comma_ints(sizes, "--sizes") for s in names}
    if cfg.quick or sizes:  # the chain group's lengths follow (else 16..256)
        cfg.chain_sizes = dict(cfg.sizes)
    if depths:
        cfg.depths = comma_ints(depths, "--depths")
    out_dir = out or default_out_dir()

    def show(row: dict) -> None:
        timing = f"{row['us']:.1f} us" if row["us"] is not None else row["reason"]
        progress.print(
            f"{row['shape']:7s} {row['group']:8s} {row['kind']:5s} T={row['T']:<4d} "
            f"{row['method']:21s} {row['dtype']:4s} {row['status']:7s} {timing}"
        )
        progress.advance(item=f"{row['shape']} {row['method']} T={row['T']}")

    with Progress("bench kernels", len(plan(cfg))) as progress:
        table = run_bench(cfg, out_dir, figures, progress=show)
    typer.echo((out_dir / "report.md").read_text(encoding="utf-8"))
    typer.echo(f"{len(table)} rows; records, manifest, report, table and figures in {out_dir}", err=True)
    check_rows(table, out_dir)


def check_budget(time_budget: float | None) -> None:
    """A time budget must be a finite number of seconds > 0 (ConfigError: exit 2)."""
    if time_budget is not None and not (math.isfinite(time_budget) and time_budget > 0):
        raise ConfigError(f"--time-budget must be a finite number of seconds > 0, got {time_budget}")


def check_rows(table: pd.DataFrame, out_dir: Path) -> None:
    """CheckFailed (exit 3) when a row's exactness check failed (status FAIL) or a row raised (error):
    the numbers are written, but the run did not measure what it was asked to."""
    bad = table[table["status"].isin(["FAIL", "error"])]
    if len(bad):
        rows = "; ".join(
            f"{r.shape} {r.method} T={r.T} {r.status}" for r in bad.head(3).itertuples(index=False)
        )
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise CheckFailed(
            f"{len(bad)} row(s) failed their check or raised: {rows}{more} (see {out_dir}/report.md)"
        )


@bench_app.command("model")
def model(
    shapes: Annotated[
        str, typer.Option(help="Comma-separated model shapes: gdn-1.3b, qwen3.6-27b, tiny.")
    ] = "gdn-1.3b,qwen3.6-27b",
    out: Annotated[
        Path | None, typer.Option(help="Run folder (default results/<date>-<device>-model).")
    ] = None,
    figures: Annotated[Path | None, typer.Option(help="Figure folder (default <out>/figures).")] = None,
    time_budget: Annotated[
        float | None,
        typer.Option(help="Seconds for the whole run; rows not started in time are recorded as skipped."),
    ] = None,
    device: Annotated[str, device_option()] = "auto",
    dtype: Annotated[str, dtype_option("weights; auto: bfloat16 on CUDA, else float32.", auto=True)] = "auto",
    context: Annotated[int, typer.Option(help="Prompt tokens prefilled before the measurements.")] = 512,
    sizes: Annotated[
        str, typer.Option(help="Tree sizes T of the verify curve.")
    ] = "1,2,4,8,16,32,64,128,256",
    step_nodes: Annotated[
        int, typer.Option(help="Tree size of the step breakdown and the ratio target.")
    ] = 64,
    compile: Annotated[
        bool, typer.Option(help="Also time decode and verify with the glue under torch.compile (CUDA).")
    ] = True,
    seed: Annotated[int, typer.Option(help="Seed of weights, prompt and trees.")] = 0,
    warmup_ms: Annotated[float, typer.Option(help="do_bench warm-up per row (ms).")] = 10.0,
    rep_ms: Annotated[float, typer.Option(help="do_bench repetitions per row (ms).")] = 40.0,
) -> None:
    """Full-model cost with random weights: AR decode vs the weight-bandwidth floor, verify latency vs
    tree size, and a draft-free step breakdown; CUDA graphs of the static-buffer decoder.

    Writes records.jsonl, manifest.json, report.md, table.csv and a figure; on CPU only the eager rows
    run (graph rows are recorded as skipped).
    """
    figure_folder(figures)
    import torch

    from repro.bench.model import (
        DTYPES,
        MODEL_SHAPES,
        ModelBenchConfig,
        default_out_dir,
        plan,
        run_model_bench,
    )
    from repro.bench.timing import TimerConfig
    from repro.models.target import auto_dtype, resolve_device

    names = shape_names(shapes, MODEL_SHAPES)
    dev = torch.device(resolve_device(device))
    _real_shapes_need_cuda(names, dev)
    dtype = short_dtype(auto_dtype(dev.type) if dtype == "auto" else dtype, tuple(DTYPES))
    if context < 1 or step_nodes < 1:
        raise ConfigError("--context and --step-nodes must be positive")
    tree_sizes = comma_ints(sizes, "--sizes")
    largest = max(tree_sizes + [step_nodes])
    if largest > MAX_TREE_NODES:
        raise ConfigError(f"--sizes and --step-nodes take trees of <= {MAX_TREE_NODES} nodes, got {largest}")
    for name in names:
        _check_fits(name, MODEL_SHAPES[name](), context + largest, "--context + the largest tree")
    check_budget(time_budget)
    timer = TimerConfig(warmup_ms=warmup_ms, rep_ms=rep_ms)
    if dev.type != "cuda":
        timer = TimerConfig(warmup_ms=min(warmup_ms, 2.0), rep_ms=min(rep_ms, 10.0))
    cfg = ModelBenchConfig(
        shapes=names,
        dtype=dtype,
        context=context,
        sizes=tree_sizes,
        step_nodes=step_nodes,
        compile=compile,
        seed=seed,
        time_budget_s=time_budget,
        timer=timer,
    )
    out_dir = out or default_out_dir(dev)

    def show(row: dict) -> None:
        timing = f"{row['us']:.1f} us" if row["us"] is not None else row["reason"]
        err = f"err {row['rel_err']:.1e}" if row["rel_err"] is not None else ""
        progress.print(
            f"{row['shape']:12s} {row['group']:8s} {row['method']:22s} T={row['T']:<4d} {row['status']:7s} "
            f"{err:12s} {timing}"
        )
        progress.advance(item=f"{row['shape']} {row['method']} T={row['T']}")

    cuda = dev.type == "cuda"
    total = len(names) * len(plan(cfg, compiled=cfg.compile and cuda, gemv=cuda))
    with Progress("bench model", total) as progress:
        table = run_model_bench(cfg, dev, out_dir, figures, progress=show)
    typer.echo((out_dir / "report.md").read_text(encoding="utf-8"))
    typer.echo(f"{len(table)} rows; records, manifest, report, table and figure in {out_dir}", err=True)
    check_rows(table, out_dir)


@bench_app.command("scale")
def scale(
    shape: Annotated[
        str,
        typer.Option(
            "--shapes", "--shape", help="Comma-separated model shapes: qwen3.6-27b, gdn-1.3b, tiny."
        ),
    ] = "qwen3.6-27b",
    routes: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated routes: ar, dflash_chain, ddtree, dflash_tfm, eagle_chain, specla "
            "(default per shape; AR always runs, first)."
        ),
    ] = None,
    acceptance: Annotated[
        str,
        typer.Option(
            help="Replayed acceptance: paper-mal (the papers' MALs, baselines/), paper-mal:SUITE, mal:X "
            "(one MAL for every route), records:DIR (per-depth acceptance of a decode run's routes)."
        ),
    ] = "paper-mal",
    out: Annotated[
        Path | None, typer.Option(help="Run folder (default results/<date>-<device>-scale).")
    ] = None,
    prompts: Annotated[int, typer.Option(min=1, help="Prompts (random token ids, seeded) per route.")] = 2,
    prompt_len: Annotated[int, typer.Option(min=1, help="Tokens per prompt.")] = 256,
    max_new_tokens: Annotated[int, typer.Option(min=2, help="New tokens per prompt.")] = 96,
    warmup_tokens: Annotated[int, typer.Option(min=1, help="Tokens of each route's untimed warm-up.")] = 16,
    logit_scale: Annotated[
        float,
        typer.Option(min=0.0, help="Scale of the random LM head (peaked drafter marginals: deep trees)."),
    ] = 20.0,
    device: Annotated[str, device_option()] = "auto",
    dtype: Annotated[str, dtype_option("weights; auto: bfloat16 on CUDA, else float32.", auto=True)] = "auto",
    seed: Annotated[int, typer.Option(help="Seed of weights, prompts and the replayed draws.")] = 0,
    switch: Annotated[
        list[str] | None,
        typer.Option(
            help="An engine switch NAME=VALUE for the run (repeatable; repro.decoding.switches: fuse_accept, "
            "pipeline, host_writes, ...), kept in its config and named in its report."
        ),
    ] = None,
) -> None:
    """End-to-end tokens/s and speedup over AR of each route at the papers' model shapes (random weights,
    drafters of their real shapes) on the graphed engine, with a stated acceptance replayed.

    Writes records.jsonl, manifest.json, report.md and table.csv; docs/gpu.md (Replayed acceptance) says
    what such a number is and is not.
    """
    import torch

    from repro.bench.model import MODEL_SHAPES
    from repro.bench.scale import (
        DEFAULT_ROUTES,
        DTYPES,
        SHAPES,
        ScaleConfig,
        check_routes,
        default_out_dir,
        parse_acceptance,
        run_scale,
    )
    from repro.decoding.switches import parse_switches
    from repro.models.target import auto_dtype, resolve_device

    names = shape_names(shape, SHAPES)
    per_shape = {}
    for name in names:
        chosen = comma_list(routes or DEFAULT_ROUTES[name])
        check_routes(chosen)
        per_shape[name] = ["ar"] + [r for r in dict.fromkeys(chosen) if r != "ar"]
    parse_acceptance(acceptance)
    switches = parse_switches(switch or [])
    longest = prompt_len + max(max_new_tokens, warmup_tokens)
    for name in names:
        _check_fits(name, MODEL_SHAPES[name](), longest, "--prompt-len + new tokens")
    if not math.isfinite(logit_scale):
        raise ConfigError(f"--logit-scale must be a finite number >= 0, got {logit_scale}")
    dev = torch.device(resolve_device(device))
    _real_shapes_need_cuda(names, dev)
    dtype = short_dtype(auto_dtype(dev.type) if dtype == "auto" else dtype, tuple(DTYPES))
    cfg = ScaleConfig(
        shapes=names,
        routes=per_shape,
        acceptance=acceptance,
        prompts=prompts,
        prompt_len=prompt_len,
        max_new_tokens=max_new_tokens,
        warmup_tokens=warmup_tokens,
        logit_scale=logit_scale,
        dtype=dtype,
        seed=seed,
        switches=switches,
    )
    out_dir = out or default_out_dir(dev)
    total = sum(len(r) for r in per_shape.values()) * prompts

    def show(rec: dict) -> None:
        mal = sum(rec["accepted_lengths"]) / max(rec["steps"], 1)
        progress.print(
            f"{rec['shape']:12s} {rec['route']:13s} prompt {rec['prompt']} MAL {mal:5.2f} "
            f"{rec['new_tokens'] / rec['decode_s']:8.1f} tok/s"
        )
        progress.advance(item=f"{rec['shape']} {rec['route']}")

    with Progress("bench scale", total) as progress:
        table = run_scale(cfg, dev, out_dir, progress=show)
    typer.echo((out_dir / "report.md").read_text(encoding="utf-8"))
    typer.echo(f"{len(table)} rows; records, manifest, report and table in {out_dir}", err=True)
