"""`repro bench kernels`: kernel benchmarks of GDN tree verification, accepted-state recovery and commit +
verify steps: the row groups and the grid of a run, the papers' numbers, and the measurement of each row.

Every row draws fresh random inputs (bf16-representable q/k/v, L2-normalised q/k, g <= 0,
beta in (0, 1), random S0), runs the method once and compares its output with the float64
reference on those same inputs (‖out - ref‖ / ‖ref‖); only a row within its precision's
tolerance is timed, a row over it is marked FAIL. Timing: median of do_bench (``us``) and of
CUDA-graph replays over several input sets (``us_graph``), see :mod:`repro.bench.timing`.

The row groups (:data:`GROUP_ROWS`; the first row of each is its block's speedup baseline): verify (draft
trees), recovery (commit the accepted path of a tree), step (commit the previous step's path, then verify),
chain (one chain from S0). Each row's derived columns (x_floor, speedup, the papers' and prior numbers of
baselines/*.yaml) are filled as the run goes (:func:`derive`).

What is timed (cases, inputs, methods, the float64 reference) and the cost model behind
``bytes_min``, ``flops`` and ``floor_us``: :mod:`repro.bench.kernel_methods`. The run's record columns,
table, report and figures: :mod:`repro.bench.kernels_report`.
"""

from __future__ import annotations

import math
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import yaml

from repro.bench.kernel_methods import (
    METHODS,
    TOLERANCE,
    Case,
    cost,
    make_inputs,
    reference,
    rel_err,
    seed_of,
    unavailable,
)
from repro.bench.kernels_report import COLUMNS, COUNTS, KIND, PARTS
from repro.bench.shapes import SHAPES, deepest_path, depths, make_tree
from repro.bench.timing import TimerConfig, measure_ceilings, time_calls, time_graph, timer_name
from repro.errors import ConfigError, describe

MAX_GRAPH_SETS = 16  # input sets a CUDA graph cycles through (enough to spill L2 for small cases)

# (method, dtype) rows per group; the first row of each group is the speedup baseline
VERIFY_ROWS = [
    ("per_branch_recurrent", "bf16"),
    ("tree_fused", "bf16"),
    ("tree_split", "bf16"),
    ("tree_split_peel", "bf16"),
    ("tree_blocked", "bf16"),
    ("hybrid", "bf16"),
    ("tree_fused", "fp32"),
    ("tree_torch", "fp32"),
    ("hybrid_torch", "fp32"),
    ("prefill_flattened", "bf16"),
    ("per_token_states", "bf16"),
]
# chain verification: the project's chain verifier vs each candidate it chooses from (same chain, same S0)
CHAIN_ROWS = [
    ("per_branch_recurrent", "bf16"),
    ("chain_chunk", "bf16"),
    ("tree_fused", "bf16"),
    ("tree_split", "bf16"),
    ("tree_blocked", "bf16"),
    ("chain_verify", "bf16"),
    ("chain_torch", "fp32"),
]
CHAIN_SIZES = [16, 32, 64, 128, 256]
RECOVERY_ROWS = [
    ("commit_replay_fla", "bf16"),
    ("commit_replay_fla_conv", "bf16"),
    ("commit_closed_form", "fp32"),
    ("commit_closed_form_fused", "fp32"),
    ("commit_path_fused", "fp32"),
    ("commit_closed_form_fused_conv", "fp32"),
    ("commit_path_fused_conv", "fp32"),
    ("commit_path_indexed", "fp32"),
    ("commit_path_indexed_conv", "fp32"),
    ("commit_snapshot", "fp32"),
]
CONV_BASELINE = "commit_replay_fla_conv"  # the baseline of the recovery rows that commit the conv history
# one decode step's GDN work: commit the previous step's accepted path, then verify the new tree
STEP_ROWS = [
    ("step_replay_fla", "bf16"),
    ("step_closed_form_fused", "bf16"),
    ("step_path_fused", "bf16"),
    ("step_delayed_fused", "bf16"),
    ("step_delayed_split", "bf16"),
    ("step_delayed_split_indexed", "bf16"),
    ("step_torch", "fp32"),
]
GROUP_ROWS = {"verify": VERIFY_ROWS, "recovery": RECOVERY_ROWS, "step": STEP_ROWS, "chain": CHAIN_ROWS}


def baseline_of(group: str, method: str) -> str:
    """The method a row's speedup is measured against: its group's first row; for a recovery row that also
    commits the conv history (``*_conv``), token replay plus the same conv-history commit."""
    if group == "recovery" and method.endswith("_conv"):
        return CONV_BASELINE
    return GROUP_ROWS[group][0][0]


PRECISION_METHODS = {
    "tree_fused",
    "tree_split",
    "tree_split_peel",
    "tree_blocked",
    "hybrid",
    "chain_verify",
    *(m for m, _ in STEP_ROWS if m != "step_torch"),
}
QUICK_SIZES = [4, 8]
QUICK_DEPTHS = [2, 4]


# ------------------------------------------------------------------------------ baselines yaml


def baselines_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "baselines"


def paper_numbers(root: Path | None = None) -> dict[tuple, dict[str, Any]]:
    """Published and prior numbers keyed by (shape, group, kind, method, dtype, T or None).

    From baselines/weaver.yaml (Table 1 / Fig. 5, B200), specla.yaml (microbenchmark ranges,
    H100) and related.yaml (stock fla kernels measured earlier on the project's H200: prior_us).
    Missing files give an empty table.
    """
    root = root or baselines_dir()

    def load(name: str) -> dict[str, Any]:
        path = root / name
        return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}

    out: dict[tuple, dict[str, Any]] = {}

    def put(key: tuple, **vals: Any) -> None:
        out.setdefault(key, {}).update(vals)

    kern = load("weaver.yaml").get("gdn_tree_verify_kernel", {})
    ref = f"baselines/weaver.yaml gdn_tree_verify_kernel ({kern.get('ref', '')}, B200)"
    for r in kern.get("rows", []):
        t = r["tree_nodes"]
        put(
            ("weaver", "verify", "draft", "tree_fused", "bf16", t),
            paper_us=r["tree_kernel_us"],
            paper_speedup=f"{r['speedup']:g}",
            paper_ref=ref,
        )
        put(
            ("weaver", "verify", "draft", "per_branch_recurrent", "bf16", t),
            paper_us=r["per_branch_recurrent_us"],
            paper_ref=ref,
        )
    for m in load("specla.yaml").get("microbenchmarks", []):
        recovery = ("recovery", "draft", "commit_closed_form_fused", "fp32")
        key = {
            "tree_verify_vs_root_to_leaf_replay": ("verify", "draft", "tree_fused", "bf16"),
            "accepted_state_recovery_vs_token_replay": recovery,
        }.get(m.get("metric"))
        if key:
            put(
                ("specla", *key, None),
                paper_speedup=f"{m['low']:g}-{m['high']:g}",
                paper_ref=f"baselines/specla.yaml {m['metric']} ({m.get('ref', '')}, H100)",
            )
    prior = load("related.yaml").get("gpu_baselines_h200_fla_0_6_0", {})
    names = {"27b_gdn": "weaver", "1.3b_gdn": "specla"}
    cols = {  # on a chain, fla's recurrence is the per-branch baseline (one branch)
        "fused_recurrent_chain_us": ("chain", "chain", "per_branch_recurrent"),
        "chunk_chain_us": ("chain", "chain", "chain_chunk"),
        "per_branch_tree_us": ("verify", "draft", "per_branch_recurrent"),
    }
    for r in prior.get("rows", []):
        for col, (group, kind, method) in cols.items():
            if col in r and r["shape"] in names:
                put((names[r["shape"]], group, kind, method, "bf16", r["T"]), prior_us=r[col])
    return out


def lookup_paper(table: dict[tuple, dict[str, Any]], key: tuple) -> dict[str, Any]:
    """The entry for the key with its T, merged over the T-independent entry (T None)."""
    return {**table.get((*key[:-1], None), {}), **table.get(key, {})}


# ----------------------------------------------------------------------------------- the grid


@dataclass
class BenchConfig:
    """What to measure: shapes, verification sizes and recovery depths per shape, tree kinds."""

    shapes: list[str] = field(default_factory=lambda: ["weaver", "specla"])
    sizes: dict[str, list[int]] = field(
        default_factory=lambda: {
            "weaver": [16, 32, 64, 128, 256],
            "specla": [16, 32, 64, 128],
            "tiny-qwen35": [17, 33, 65],
        }
    )
    chain_sizes: dict[str, list[int]] = field(
        default_factory=lambda: {"weaver": CHAIN_SIZES, "specla": CHAIN_SIZES, "tiny-qwen35": CHAIN_SIZES}
    )  # the chain group's lengths
    kinds: list[str] = field(default_factory=lambda: ["draft", "chain"])
    depths: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    recovery_nodes: int = 128
    step_nodes: int = 64  # the step rows' tree (SpecLA's T = 64) and previous accepted depths
    step_depths: list[int] = field(default_factory=lambda: [2, 4, 8])
    bf16_precision: str = "tf32"  # tree_fused's float32 dots with bf16 inputs (fp32 rows: "ieee")
    seed: int = 0
    quick: bool = False
    budget_s: float | None = None  # rows not started within this many seconds are recorded as skipped
    groups: list[str] | None = None  # only these row groups (verify, recovery, step, chain); None: all
    methods: list[str] | None = None  # only these methods (each block's baseline kept); None: all
    timer: TimerConfig = field(default_factory=TimerConfig)

    def as_dict(self) -> dict[str, Any]:
        return {
            "bench": "kernels",
            "shapes": {s: vars(SHAPES[s]) for s in self.shapes},
            "sizes": self.sizes,
            "chain_sizes": self.chain_sizes,
            "kinds": self.kinds,
            "depths": self.depths,
            "recovery_nodes": self.recovery_nodes,
            "step_nodes": self.step_nodes,
            "step_depths": self.step_depths,
            "bf16_precision": self.bf16_precision,
            "seed": self.seed,
            "quick": self.quick,
            "budget_s": self.budget_s,
            "groups": self.groups,
            "methods": self.methods,
            "timer": vars(self.timer),
            "tolerance": TOLERANCE,
            "tree": "draft_tree(n, seed, max_depth=16, branching=4, alpha=0.15) or chain",
            "max_graph_sets": MAX_GRAPH_SETS,
        }


@dataclass(frozen=True)
class RowSpec:
    shape: str
    group: str  # verify | recovery | step | chain
    kind: str
    T: int
    method: str
    dtype: str
    accepted: int | None = None


def block_deadline(budget_s: float, blocks: list[tuple[str, str]], block: tuple[str, str]) -> float:
    """Seconds into the run after which a (group, shape) block's rows are no longer started: the budget is
    shared evenly by the blocks in plan order, and a block may use what the blocks before it left unspent
    (so one slow group or shape cannot starve the rest of a side-by-side run)."""
    return budget_s * (blocks.index(block) + 1) / len(blocks)


def plan(cfg: BenchConfig) -> list[RowSpec]:
    """Every row, the most telling first (tree verification, recovery, steps, then chains; see ``budget_s``),
    of ``groups`` and ``methods`` when given.

    Each (shape, group, kind, T[, depth]) block starts with its baseline (kept whatever ``methods`` says).
    """
    rows: list[RowSpec] = []
    for kind in [k for k in cfg.kinds if k != "chain"]:
        for shape in cfg.shapes:
            rows += [
                RowSpec(shape, "verify", kind, t, m, d) for t in cfg.sizes[shape] for m, d in VERIFY_ROWS
            ]
    for shape in cfg.shapes:
        for depth in cfg.depths:
            rows += [
                RowSpec(shape, "recovery", "draft", cfg.recovery_nodes, m, d, depth) for m, d in RECOVERY_ROWS
            ]
    step_nodes = min(cfg.step_nodes, cfg.recovery_nodes) if cfg.quick else cfg.step_nodes
    step_depths = cfg.depths if cfg.quick else cfg.step_depths
    for shape in cfg.shapes:
        for depth in step_depths:
            rows += [RowSpec(shape, "step", "draft", step_nodes, m, d, depth) for m, d in STEP_ROWS]
    if "chain" in cfg.kinds:
        for shape in cfg.shapes:
            sizes = cfg.chain_sizes.get(shape, cfg.sizes[shape])
            rows += [RowSpec(shape, "chain", "chain", t, m, d) for t in sizes for m, d in CHAIN_ROWS]
    chosen = set(METHODS) if cfg.methods is None else set(cfg.methods)
    kept = chosen | {baseline_of(r.group, r.method) for r in rows if r.method in chosen}
    kept |= {table[0][0] for table in GROUP_ROWS.values()}
    return [r for r in rows if (cfg.groups is None or r.group in cfg.groups) and r.method in kept]


def check_selection(groups: list[str] | None, methods: list[str] | None) -> None:
    """One-line ConfigError for a group or method the bench does not have, or an empty selection."""
    for option, chosen in (("--groups", groups), ("--methods", methods)):
        if chosen is not None and not chosen:
            raise ConfigError(f"{option} must name at least one value")
    for group in groups or []:
        if group not in GROUP_ROWS:
            raise ConfigError(f"unknown row group {group!r}: choose from {', '.join(GROUP_ROWS)}")
    known = {m for table in GROUP_ROWS.values() for m, _ in table}
    for method in methods or []:
        if method not in known:
            raise ConfigError(f"unknown method {method!r}: choose from {', '.join(sorted(known))}")


def make_case(spec: RowSpec, cfg: BenchConfig, device: torch.device) -> Case:
    """The tree of a row: the same tree for every method of one (shape, kind, T).

    Recovery rows use the first tree of a fixed seed sequence that is at least max(cfg.depths) deep,
    so that every accepted depth is cut from the same deepest path.
    """
    need = (
        1 if spec.accepted is None else spec.accepted if spec.group == "step" else max(cfg.depths, default=1)
    )
    for attempt in range(100):
        parents = make_tree(spec.kind, spec.T, seed_of("tree", spec.kind, spec.T, cfg.seed, attempt))
        if max(depths(parents)) >= need:
            break
    accepted = deepest_path(parents, spec.accepted) if spec.accepted is not None else None
    precision = "ieee" if spec.dtype == "fp32" else cfg.bf16_precision
    return Case(SHAPES[spec.shape], spec.kind, parents, device, accepted, precision)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def graph_sets(device: torch.device, nbytes: int) -> int:
    """Input sets a graph cycles through so that one cycle moves at least 3x the L2 size."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return max(1, min(MAX_GRAPH_SETS, math.ceil(3 * l2 / max(nbytes, 1))))


def measure(
    spec: RowSpec, cfg: BenchConfig, device: torch.device, ceilings: dict[str, Any], skip: str | None = None
) -> dict[str, Any]:
    """One row: build, check against float64, time (or record why not, e.g. ``skip``)."""
    seed = seed_of(spec, cfg.seed)
    row: dict[str, Any] = {c: None for c in COLUMNS + COUNTS + PARTS}
    row.update(
        shape=spec.shape,
        group=spec.group,
        kind=spec.kind,
        T=spec.T,
        method=spec.method,
        dtype=spec.dtype,
        tol=TOLERANCE[spec.dtype],
        timer=timer_name(device),
        seed=seed,
        reason="",
    )
    method = METHODS[spec.method]
    try:
        case = make_case(spec, cfg, device)
        row.update(
            precision=case.precision if spec.method in PRECISION_METHODS else None,
            depth=spec.accepted if spec.group in ("recovery", "step") else case.depth,
            leaves=len(case.paths),
            flat_len=case.flat_len,
        )
        nbytes, flops, rate = cost(spec.method, spec.dtype, case)
        t_bytes = nbytes / (ceilings["copy_GBps"] * 1e3)
        t_flops = flops / (ceilings[f"{rate}_TFLOPs"] * 1e6)
        row.update(
            bytes_min=nbytes,
            flops=flops,
            floor_us=max(t_bytes, t_flops),
            floor_bound="bytes" if t_bytes >= t_flops else "flops",
        )
        why = skip or unavailable(method.needs, device)
        if why:
            row.update(status="skipped", reason=why)
            return row
        with torch.no_grad():
            x64 = make_inputs(case.shape, case.n, seed, device)
            x = x64.to(spec.dtype)
            fn = method.build(case, x)
            out = fn()
            _sync(device)
            err = rel_err(out, reference(method.output, case, x64))
            row["rel_err"] = err
            del out
            if not err <= row["tol"]:  # NaN fails too
                row.update(status="FAIL", reason=f"rel err {err:.2e} > tol {row['tol']:.0e}: not timed")
                return row
            timed = time_calls(fn, device, cfg.timer)
            row.update(us=timed.us, n_timed=timed.n, status="ok")
            if device.type == "cuda" and method.graphable:
                sets = graph_sets(device, nbytes)
                inputs = [x] + [
                    make_inputs(case.shape, case.n, seed + i, device).to(spec.dtype) for i in range(1, sets)
                ]
                fns = [fn] + [method.build(case, xi) for xi in inputs[1:]]
                try:
                    replays = time_graph(fns, device, cfg.timer, row["us"])
                    row.update(us_graph=replays.us, graph_sets=sets)
                    row.update(graph_replays=replays.n, graph_calls=replays.calls)
                    if method.phase1 is not None:  # where the row's time goes: its first launch alone
                        part = [method.phase1(case, xi) for xi in inputs]
                        row["phase1_us_graph"] = time_graph(part, device, cfg.timer, replays.us).us
                except Exception as exc:  # noqa: BLE001 - a failed capture is recorded, the row stays
                    _sync(device)
                    what = "phase 1's graph" if row["us_graph"] is not None else "graph capture"
                    row["reason"] = f"{what} failed: {describe(exc)}"
            elif method.graph_note and device.type == "cuda":
                row["reason"] = method.graph_note
    except Exception as exc:  # noqa: BLE001 - one broken method must not stop the table
        row.update(status="error", reason=describe(exc))
        print(f"== {spec}: error", file=sys.stderr)
        traceback.print_exc()  # the whole story goes to the log; the record keeps one line
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def _block(row: dict[str, Any]) -> tuple:
    """The rows a speedup compares: same shape, group, tree and (recovery, step) accepted depth."""
    return (
        row["shape"],
        row["group"],
        row["kind"],
        row["T"],
        row["depth"] if row["group"] in ("recovery", "step") else 0,
    )


def derive(row: dict[str, Any], rows: Iterable[dict[str, Any]], paper: dict[tuple, dict[str, Any]]) -> None:
    """Fill ratio to floor, speedup vs the block's baseline (the group's first row) and the paper columns."""
    for col, src in (("x_floor", "us"), ("x_floor_graph", "us_graph")):
        if row[src] is not None and row["floor_us"]:
            row[col] = row[src] / row["floor_us"]
    row["baseline"] = baseline_of(row["group"], row["method"])
    base = [o for o in rows if _block(o) == _block(row) and o["method"] == row["baseline"]]
    for col, src in (("speedup", "us"), ("speedup_graph", "us_graph")):
        if base and base[0][src] is not None and row[src]:
            row[col] = base[0][src] / row[src]
    key = (row["shape"], row["group"], row["kind"], row["method"], row["dtype"], row["T"])
    row.update(lookup_paper(paper, key))


# ------------------------------------------------------------------------------------ the run


def default_out_dir() -> Path:
    return Path("results") / f"bench-kernels-{datetime.now(timezone.utc):%Y-%m-%d}"


def run_bench(
    cfg: BenchConfig,
    out_dir: str | Path,
    figures_dir: str | Path | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> pd.DataFrame:
    """Measure every row of the plan; write records.jsonl (as rows come), manifest, report, table, figures.

    CPU, or ``cfg.quick``: the CPU device, the perf_counter timer; methods that need CUDA are
    recorded as skipped. Returns the table.
    """
    from repro.reporting.records import build_manifest
    from repro.reporting.rundir import RunDir, check_figures_dir

    out_dir = Path(out_dir)
    figures = Path(figures_dir) if figures_dir is not None else out_dir / "figures"
    check_figures_dir(figures, out_dir)  # bad input: refused before anything is written
    device = torch.device("cuda" if torch.cuda.is_available() and not cfg.quick else "cpu")
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    manifest = build_manifest(cfg.as_dict(), seed=cfg.seed)
    with RunDir(out_dir, manifest, kind=KIND) as run:  # refuses an existing run before measuring
        ceilings = measure_ceilings(device, cfg.timer, quick=device.type != "cuda")
        bench_device = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        run.update_manifest(bench_device=bench_device, ceilings=ceilings)
        paper = paper_numbers()
        rows: list[dict[str, Any]] = []
        start = time.monotonic()
        specs = plan(cfg)
        blocks = list(dict.fromkeys((s.group, s.shape) for s in specs))
        for spec in specs:
            over = cfg.budget_s is not None and time.monotonic() - start > block_deadline(
                cfg.budget_s, blocks, (spec.group, spec.shape)
            )
            skip = (
                f"time budget of {cfg.budget_s:g} s spent (the {spec.shape} {spec.group} rows' share)"
                if over
                else None
            )
            row = measure(spec, cfg, device, ceilings, skip)
            derive(row, rows + [row], paper)
            rows.append(row)
            run.append(row)
            if progress:
                progress(row)
        run.write_report(figures)
    return pd.DataFrame(rows, columns=COLUMNS + COUNTS + PARTS)
