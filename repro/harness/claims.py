"""The claims ledger (``repro claims``): every published claim of ``baselines/`` beside the latest value
measured in ``results/``, the ratio and a verdict, written to ``results/CLAIMS.md``.

Nothing is measured here: values are read from the committed run directories' records (the latest
folder of the claim's result kind, by manifest ``created_at``, run under the claim's ``conditions`` (its
manifest config, e.g. the paper's temperature), that is not wholly superseded in ``supersedes.json`` and
holds a matching record; a claim read over rows (a published range over tree sizes or depths) takes each
row from the newest run holding it, ``Claim.row_key``). Each claim is one row of :data:`CLAIMS`: its id,
where the paper's value sits in ``baselines/``, the command that tests it, the result kind and a
reader, and how the value is judged (``at_least`` / ``at_most`` / ``about`` the paper's value within
``tolerance``, relative; ``range``: both ends of a published range). A reader returns None only when the
run does not hold the claim's route / row (then an older run is read); a value it holds decides the
verdict, also NaN ("not measured") and ``inf`` (never reached, e.g. a draft length that never breaks
even). A claim whose result kind has no folder yet reads "not yet measured"; one that this harness cannot
test says why.

Partly superseded runs (``"partly": true`` in ``supersedes.json``): the free-text ``why`` is not parsed;
the run named in ``by`` is read instead. A claim read at one value skips the partly superseded run when
``by`` holds that value; a claim read over rows drops its rows of a family (the row key without size,
depth) that ``by`` measured. Everything else in it counts (e.g. the Weaver-shape kernel rows of
``2026-11-30-h200-kernels/bench-kernels``, whose SpecLA-shape rows ``2026-11-30-h200-kernels-2`` replaced).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from repro.errors import ReproError, not_a_folder
from repro.reporting.report import host_bound, summarize

BASELINES = Path(__file__).resolve().parents[2] / "baselines"
LEDGER_HEADING = "# Claims ledger"  # the first line of CLAIMS.md
Reader = Callable[[list[Any]], float | None]


@dataclass(frozen=True)
class Claim:
    """One published claim and how the harness tests it."""

    id: str
    paper: str  # baselines file stem
    key: str  # where the value is in the baselines file (for people), e.g. "end_to_end[0]"
    value: Callable[[dict], float]  # the paper's value from the parsed baselines file
    statement: str
    command: str
    kind: str | None  # the result kind holding the measurement; None: not testable here
    read: Reader | None = None
    judge: str = "at_least"  # at_least | at_most | about (within the tolerance either way)
    tolerance: float = 0.1  # relative slack before "not reproduced"
    note: str = ""  # why not testable, or what the measurement is
    gpu_only: bool = False  # an end-to-end speed: only runs on the GPU engine count (eager runs time Python)
    # a claim read at the best row over several runs (a range's "best T"): each row's key, so that a
    # row counts from the newest run holding its key and the best of those is the measurement
    row_key: Callable[[dict], tuple] | None = None
    # what the source run's records say about the measurement's standing (None: nothing), in the verdict
    caveat: Callable[[list[Any]], str | None] | None = None
    # the manifest config a run must have been run under to count (the paper's setting), e.g. temperature
    conditions: tuple[tuple[str, Any], ...] = ()
    high: Callable[[dict], float] | None = None  # judge "range": the paper's high end (value: the low end)
    size: Callable[[dict], Any] | None = None  # judge "range": a row's size (the range runs over sizes)


# ----------------------------------------------------------------------------------- readers


def _pool_kept(k: int) -> Reader:
    """Mean share of the target's mass kept by the top-k pool, over every position of every depth."""

    def read(records: list[dict]) -> float | None:
        rows = [r for r in records if r.get("record") == "pool" and r["k"] == k]
        n = sum(r["positions"] for r in rows)
        return 1 - sum(r["mean_outside"] * r["positions"] for r in rows) / n if n else None

    return read


def _kernel(
    shape: str,
    group: str,
    methods: tuple[str, ...],
    field: str,
    t: int | None = None,
    dtype: str | None = "bf16",
) -> Reader:
    """The best (lowest us / highest speedup) value of ``field`` among ok rows of a kernel bench on
    draft trees (tree kind ``draft``; ``t`` nodes when given, of ``dtype`` when given) of any of the
    project's ``methods`` (its kernels for that job: the claim is read at the best of them)."""

    def read(records: list[dict]) -> float | None:
        vals = [
            r[field] for r in records
            if r.get("shape") == shape and r.get("group") == group and r.get("method") in methods
            and r.get("kind") == "draft" and (dtype is None or r.get("dtype") == dtype)
            and r.get("status") == "ok" and (t is None or r.get("T") == t)
            and isinstance(r.get(field), (int, float))
        ]  # fmt: skip
        if not vals:
            return None
        return float(min(vals) if field.startswith("us") else max(vals))

    return read


def _kernel_row_key(r: dict) -> tuple:
    """A kernel bench row's identity: shape, group, tree kind, size and depth, method, dtype."""
    return tuple(r.get(k) for k in ("shape", "group", "kind", "T", "depth", "method", "dtype"))


def _kernel_size(r: dict) -> tuple:
    """A kernel bench row's tree size and depth (a published range runs over these)."""
    return (r.get("T"), r.get("depth"))


def _kernel_family(r: dict) -> tuple:
    """The row key without the tree's size and depth (what a partial supersede re-measured)."""
    return tuple(r.get(k) for k in ("shape", "group", "kind", "method", "dtype"))


def _table2_speedup(method: str, workload: str = "all", protocol: str = "best-of") -> Reader:
    """``method``'s speedup over AR in a Table 2 run (the table the run's report is built from)."""

    def read(records: list[Any]) -> float | None:
        from repro.paper.table2 import tables

        t, _ = tables(records)
        hit = t[(t["method"] == method) & (t["workload"] == workload) & (t["protocol"] == protocol)]
        return float(hit["speedup"].iloc[0]) if len(hit) else None

    return read


def _table2_gain(method: str, base: str, workload: str = "all", protocol: str = "best-of") -> Reader:
    """``method``'s tokens/s per sequence over ``base``'s, less one, in a Table 2 run (batch 1: tokens/s
    per sequence is the paper's interactivity), paired per prompt as every speedup of the reports
    (:func:`repro.reporting.stats.compare` on the table's routes)."""

    def read(records: list[Any]) -> float | None:
        from repro.paper.table2 import tables
        from repro.reporting.report import suites_of
        from repro.reporting.stats import SPEEDUP, compare

        t, _ = tables(records)
        t = t[(t["workload"] == workload) & (t["protocol"] == protocol)].set_index("method")
        if method not in t.index or base not in t.index:
            return None
        suites = suites_of(records) if workload == "all" else [workload]
        return compare(records, t.loc[method, "route"], t.loc[base, "route"], suites, SPEEDUP).value - 1

    return read


def _table2_mal_gain(base: str, budget: int = 64, workload: str = "all", protocol: str = "uniform") -> Reader:
    """DFlash-TfM's MAL over ``base``'s, less one, in a Table 2 run's gains table (paired per prompt), when
    the trees of both routes had ``budget`` nodes (None otherwise: the run does not hold the claim's row)."""

    def read(records: list[Any]) -> float | None:
        from repro.paper.table2 import tables

        _, g = tables(records)
        if g.empty:
            return None
        hit = g[(g["over"] == base) & (g["workload"] == workload) & (g["protocol"] == protocol)]
        if not len(hit):
            return None
        budgets = {r.route: r.route_params.get("budget") for r in records}
        tree = [hit["route"].iloc[0]] + ([hit["base_route"].iloc[0]] if base == "DDTree" else [])
        if any(budgets.get(route) != budget for route in tree):
            return None
        return float(hit["MAL_ratio"].iloc[0] - 1)

    return read


def _specla_speedup(workload: str, method: str = "SpecLA") -> Reader:
    """``method``'s speedup over AR on ``workload`` in a SpecLA-table run."""

    def read(records: list[Any]) -> float | None:
        from repro.paper.specla_table import table

        t = table(records)
        hit = t[(t["method"] == method) & (t["workload"] == workload)]
        return float(hit["speedup"].iloc[0]) if len(hit) else None

    return read


def _scale_speedup(shape: str, route: str, acceptance: str = "paper-mal") -> Reader:
    """``route``'s speedup over AR at ``shape`` in a ``repro bench scale`` run whose replayed acceptance is
    ``acceptance`` (the paper's MAL: random weights at the real shape, real costs)."""

    def read(records: list[Any]) -> float | None:
        from repro.bench.scale import summary_table

        t = summary_table([r for r in records if r.get("status") == "ok"])
        hit = t[(t["shape"] == shape) & (t["route"] == route) & t["acceptance"].str.startswith(acceptance)]
        return float(hit["speedup"].iloc[0]) if len(hit) else None  # NaN: held but not measured

    return read


def _one_draw(records: list[Any]) -> str | None:
    """A scale run whose replayed routes' prompts all replayed the same acceptance draws (records without
    ``acceptance_seed``, before repro.bench.scale.acceptance_seed): its MALs are one sample each."""
    replayed = [r for r in records if r.get("status") == "ok" and r.get("acceptance")]
    if replayed and not any("acceptance_seed" in r for r in replayed):
        return "one acceptance draw replayed for all its prompts: each MAL one sample; re-run pending"
    return None


def _host_bound(records: list[Any]) -> str | None:
    """A GPU table run whose routes ran host-bound (:func:`repro.reporting.report.host_bound`): its
    speedups time the host there, not the GPU."""
    slow = host_bound(summarize(records))
    if not slow:
        return None
    named = ", ".join(f"{route} {ratio:.2f}" for route, ratio in slow)
    return f"host-bound routes in that run (wall over the graphs' busy time {named}): not GPU speedups"


def _break_evens(records: list[Any]) -> dict[int, float] | None:
    """Per draft length k of the acceptance study (synthetic chains): the break-even p; ``inf`` when no
    tested p breaks even (speculation never profitable at that k), NaN when no speedup was measured there;
    None when the run holds no acceptance study."""
    from repro.reporting.report import acceptance_table, break_even_p

    acc = acceptance_table(records)
    if acc.empty or not (acc["kind"] == "synthetic_chain").any():
        return None
    acc = acc[acc["kind"] == "synthetic_chain"]
    measured = {int(k) for k, g in acc.groupby("k") if g["speedup"].notna().any()}
    found = break_even_p(acc, kind="synthetic_chain")
    never = {k: math.inf if k in measured else math.nan for k in found}
    return {k: never[k] if p is None else p for k, p in found.items()} or None


def _break_even_p(records: list[Any], paper: float = 0.7) -> float | None:
    """ "Below ~0.7 speculation is unprofitable at every tested draft length": every k is judged, so the
    value is the break-even p of the k farthest from ``paper`` (``inf`` when some k never breaks even, NaN
    when some k was not measured); the per-k values are in the verdict (:func:`_break_even_detail`)."""
    found = _break_evens(records)
    if found is None:
        return None
    vals = list(found.values())
    if any(math.isnan(v) for v in vals):
        return math.nan
    return max(vals, key=lambda v: abs(v - paper))


def _break_even_detail(records: list[Any]) -> str | None:
    found = _break_evens(records) or {}
    text = " / ".join("never" if math.isinf(p) else f"{p:.3f}" for p in found.values())
    return f"break-even p {text} at k = {' / '.join(map(str, found))}" if found else None


def _first(section: str, i: int, field: str = "value") -> Callable[[dict], float]:
    return lambda b: float(b[section][i][field])


def _kernel_row(t: int, field: str, table: str = "rows") -> Callable[[dict], float]:
    """The paper's ``field`` at ``t`` nodes in its tree-verify kernel ``table`` (rows, production)."""
    return lambda b: float(next(r for r in b["gdn_tree_verify_kernel"][table] if r["tree_nodes"] == t)[field])


TREE_KERNELS = (
    "tree_fused",
    "tree_split",
    "tree_split_peel",
    "tree_blocked",
)  # the project's tree-verification kernels (bench methods)
COMMIT_KERNELS = (  # its commits of an accepted path (bench methods)
    "commit_closed_form_fused",
    "commit_path_fused",
    "commit_path_fused_conv",
    "commit_path_indexed",
    "commit_path_indexed_conv",
)
TINY = "tiny family on CPU (3.8M-parameter target), not the paper's 27B target"
TINY_MODEL = "tiny family (3.8M-parameter target), not the paper's 27B target"  # a property of the model
ON_CARD = "{card}; the paper's: B200"  # {card}: the measured run's GPU (_cards)
TABLE2, SPECLA = "repro run table2", "repro run specla"
SCALE = "repro bench scale --shape qwen3.6-27b,gdn-1.3b --acceptance paper-mal"
REPLAYED = "random weights at the paper's shape on an {card}, the paper's MAL replayed: is the speedup "
REPLAYED += "consistent with the claimed MAL on this hardware; not a real-checkpoint number"
T1 = (("temperature", 1.0),)  # Weaver's setting (baselines/weaver.yaml setup)
WEAVER_RUN = (*T1, ("dtype", "bfloat16"))  # its timings: also its dtype
MAL_AT = "tiny family, T=1, both trees of 64 nodes, uniform protocol (sample_match on both sides), all "
MAL_AT += "workloads; MAL is a property of the pair, so CPU runs count"
CLAIMS: tuple[Claim, ...] = (
    Claim("W1", "weaver", "end_to_end[0]", _first("end_to_end", 0), "DFlash-TfM 4.37x over AR (Table 2)",
          TABLE2, "paper-table2", _table2_speedup("DFlash-TfM"),
          note="best-of protocol, all workloads, T=1, bf16", gpu_only=True, conditions=WEAVER_RUN,
          caveat=_host_bound),
    Claim("W1-scale", "weaver", "end_to_end[0]", _first("end_to_end", 0),
          "DFlash-TfM 4.37x over AR at the Qwen3.6-27B shape (MAL replayed)", SCALE, "bench-scale",
          _scale_speedup("qwen3.6-27b", "dflash_tfm"), note=REPLAYED, gpu_only=True, caveat=_one_draw),
    Claim("W2", "weaver", "end_to_end[1]", _first("end_to_end", 1), "+24.7% interactivity over DFlash",
          TABLE2, "paper-table2", _table2_gain("DFlash-TfM", "DFlash (chain)"),
          note="tokens/s per sequence over chain DFlash, best-of protocol, all workloads, T=1, bf16",
          gpu_only=True, conditions=WEAVER_RUN, caveat=_host_bound),
    Claim("W3", "weaver", "end_to_end[2]", _first("end_to_end", 2), "MAL +77% vs chain DFlash (budget 64)",
          TABLE2, "paper-table2", _table2_mal_gain("DFlash (chain)"), note=MAL_AT, conditions=T1),
    Claim("W4", "weaver", "end_to_end[3]", _first("end_to_end", 3), "MAL +32% vs DDTree (same tree size)",
          TABLE2, "paper-table2", _table2_mal_gain("DDTree"), note=MAL_AT, conditions=T1),
    Claim("W5", "weaver", "pool[0]", _first("pool", 0), "top-512 pool keeps 97.8% of the verifier's mass",
          "repro falsify --pool-mass", "falsify-pool-mass", _pool_kept(512), tolerance=0.01, note=TINY_MODEL),
    Claim("W6", "weaver", "pool[1]", _first("pool", 1), "Weaver adapter of 56.7M parameters", "-", None,
          note="a model size, not a measurement; the embedded adapter is a tiny stand-in"),
    *(
        Claim(f"W7-T{t}", "weaver", f"gdn_tree_verify_kernel.rows[T={t}].tree_kernel_us",
              _kernel_row(t, "tree_kernel_us"), f"tree-verify kernel, {t} nodes, us/layer (lower is better)",
              "repro bench kernels --shapes weaver", "bench-kernels",
              _kernel("weaver", "verify", TREE_KERNELS, "us_graph", t), judge="at_most", note=ON_CARD)
        for t in (16, 32, 64, 128)
    ),
    *(
        Claim(f"W8-T{t}", "weaver", f"gdn_tree_verify_kernel.rows[T={t}].speedup",
              _kernel_row(t, "speedup"), f"tree kernel over per-branch verification, {t} nodes",
              "repro bench kernels --shapes weaver", "bench-kernels",
              _kernel("weaver", "verify", TREE_KERNELS, "speedup_graph", t), note=ON_CARD)
        for t in (16, 32, 64, 128)
    ),
    Claim("W9", "weaver", "gdn_tree_verify_kernel.production[0].tree_kernel_us",
          _kernel_row(129, "tree_kernel_us", "production"),
          "production tree of 129 nodes, 87 us/layer (lower is better)",
          "repro bench kernels --shapes weaver --sizes 129", "bench-kernels",
          _kernel("weaver", "verify", TREE_KERNELS, "us_graph", 129), judge="at_most",
          note=ON_CARD + "; the bench's random draft tree of 129 nodes, not the paper's production tree"),
    Claim("S1", "specla", "end_to_end[0]", _first("end_to_end", 0), "1.42x over AR (mixed suite)", SPECLA,
          "paper-specla", _specla_speedup("mixed"), gpu_only=True, caveat=_host_bound),
    Claim("S2", "specla", "end_to_end[1]", _first("end_to_end", 1), "1.70x over AR (GSM8K)", SPECLA,
          "paper-specla", _specla_speedup("gsm8k"), gpu_only=True, caveat=_host_bound),
    Claim("S3", "specla", "end_to_end[2]", _first("end_to_end", 2), "1.06x over AR (HumanEval)", SPECLA,
          "paper-specla", _specla_speedup("humaneval"), gpu_only=True, caveat=_host_bound),
    Claim("S1-scale", "specla", "end_to_end[0]", _first("end_to_end", 0),
          "SpecLA 1.42x over AR at the GDN-1.3B shape (MAL replayed)", SCALE, "bench-scale",
          _scale_speedup("gdn-1.3b", "specla"), note=REPLAYED, gpu_only=True, caveat=_one_draw),
    Claim("S4", "specla", "microbenchmarks[0].low-high", _first("microbenchmarks", 0, "low"),
          "tree verification 1.8-7.1x over root-to-leaf replay (range over tree sizes; both ends)",
          "repro bench kernels --shapes specla", "bench-kernels",
          _kernel("specla", "verify", TREE_KERNELS, "speedup_graph"), judge="range",
          high=_first("microbenchmarks", 0, "high"), note="{card}; the paper's: H100; best kernel per T",
          row_key=_kernel_row_key, size=_kernel_size),
    Claim("S5", "specla", "microbenchmarks[1].low-high", _first("microbenchmarks", 1, "low"),
          "accepted-state recovery 2.74-4.28x over token replay (range over rows; both ends, CUDA graphs)",
          "repro bench kernels", "bench-kernels",
          _kernel("specla", "recovery", COMMIT_KERNELS, "speedup_graph", dtype=None), judge="range",
          high=_first("microbenchmarks", 1, "high"),
          note="{card}; the paper's: H100; best commit kernel per (T, depth)", row_key=_kernel_row_key,
          size=_kernel_size),
    Claim("S6", "specla", "controlled_acceptance[0]", _first("controlled_acceptance", 0),
          "break-even acceptance probability ~0.7, unprofitable below it at every draft length",
          "repro run acceptance --device cuda", "paper-acceptance", _break_even_p, judge="about",
          tolerance=0.15, gpu_only=True, caveat=_break_even_detail,
          note="tiny family on the {card} graphed engine; every k judged: measured is the k farthest from"
          " 0.7"),
)  # fmt: skip


# ----------------------------------------------------------------------------------- reading


def _matches(config: dict, conditions: tuple[tuple[str, Any], ...]) -> bool:
    """Whether a manifest config was run under every (key, value) of ``conditions`` (numbers compared as
    numbers; a key the config lacks does not match)."""
    for key, want in conditions:
        got = config.get(key)
        if isinstance(want, (int, float)) and isinstance(got, (int, float)):
            if not math.isclose(float(got), float(want)):
                return False
        elif got != want:
            return False
    return True


def _supersedes(results: Path) -> dict[str, dict]:
    from repro.reporting.index import read_supersedes

    return read_supersedes(results).get("superseded", {})


def latest_runs(
    results: Path, kind: str, gpu_only: bool = False, conditions: tuple[tuple[str, Any], ...] = ()
) -> list[tuple[str, list[Any]]]:
    """(folder relative to ``results``, records) of every run of ``kind`` there, newest first, without
    the wholly superseded ones (``gpu_only``: only runs on a CUDA device with the graphed engine;
    ``conditions``: only runs whose manifest config holds them, see :func:`_matches`)."""
    from repro.harness.run_kinds import load_run
    from repro.reporting.index import run_folders
    from repro.reporting.rundir import infer_kind, read_manifest

    sup = _supersedes(results)
    found = []
    for folder in run_folders(results):
        rel = folder.relative_to(results).as_posix()
        manifest = read_manifest(folder)
        if infer_kind(manifest) != kind or (rel in sup and not sup[rel].get("partly")):
            continue
        config = manifest.get("config") or {}
        engine = str(config.get("engine") or "")
        on_gpu_engine = (manifest.get("device_info") or {}).get("cuda") and engine.split(" ")[0] == "graphed"
        if (gpu_only and not on_gpu_engine) or not _matches(config, conditions):
            continue
        found.append((manifest.get("created_at", ""), rel, folder))
    found.sort(reverse=True)
    return [(rel, load_run(folder).records) for _, rel, folder in found]


def partly_superseded(results: Path, kind: str) -> dict[str, list[Any]]:
    """Per partly superseded run of ``kind``: the records of the run(s) its ``by`` names (a run folder or
    a folder of runs)."""
    from repro.harness.run_kinds import load_run
    from repro.reporting.index import run_folders
    from repro.reporting.rundir import infer_kind, read_manifest

    partly = {rel: e["by"] for rel, e in _supersedes(results).items() if e.get("partly") and e.get("by")}
    if not partly:
        return {}
    folders = {f.relative_to(results).as_posix(): f for f in run_folders(results)}
    out: dict[str, list[Any]] = {}
    for rel, by in partly.items():
        if rel not in folders or infer_kind(read_manifest(folders[rel])) != kind:
            continue
        out[rel] = [
            r for name, f in folders.items() if name == by or name.startswith(by + "/")
            for r in load_run(f).records
        ]  # fmt: skip
    return out


def without_superseded_parts(
    c: Claim, runs: list[tuple[str, list[Any]]], partly: dict[str, list[Any]]
) -> list[tuple[str, list[Any]]]:
    """The runs less what their partial supersedes re-measured: a claim read over rows drops a partly
    superseded run's rows of every family (:func:`_kernel_family`) its ``by`` run measured; a claim read at
    one value drops the whole run when ``by`` holds that value."""
    assert c.read is not None
    out = []
    for rel, recs in runs:
        by = partly.get(rel)
        if by is not None:
            if c.row_key is not None:
                redone = {_kernel_family(r) for r in by if isinstance(r, dict) and r.get("status") == "ok"}
                recs = [r for r in recs if not (isinstance(r, dict) and _kernel_family(r) in redone)]
            elif c.read(by) is not None:
                continue
        out.append((rel, recs))
    return out


def verdict(
    claim: Claim, paper: float, measured: float, high: float | None = None, paper_high: float | None = None
) -> str:
    """reproduced / not reproduced, by ``claim.judge`` within ``claim.tolerance`` (relative); "not
    measured" for a NaN measurement (a run that holds the row but no number: not a refutation).
    ``range``: ``paper`` and ``measured`` are the low ends, ``high`` / ``paper_high`` the high ends, and both
    ends must be reached (each at least the paper's end within the tolerance)."""
    if math.isnan(measured) or (high is not None and math.isnan(high)):
        return "not measured"
    if claim.judge == "range":
        assert high is not None and paper_high is not None
        ok = measured >= paper * (1 - claim.tolerance) and high >= paper_high * (1 - claim.tolerance)
    elif claim.judge == "about":
        ok = abs(measured - paper) <= abs(paper) * claim.tolerance
    elif claim.judge == "at_most":
        ok = measured <= paper * (1 + claim.tolerance)
    else:
        ok = measured >= paper * (1 - claim.tolerance)
    return "reproduced" if ok else "not reproduced"


def _latest_hit(c: Claim, runs: list[tuple[str, list[Any]]]) -> tuple[str, float] | None:
    """(folder, value) from the newest run whose records hold the claim's value (a NaN or ``inf`` value is
    held: it decides the verdict; only None, the route / row absent, falls back to an older run)."""
    assert c.read is not None
    return next(((rel, v) for rel, recs in runs if (v := c.read(recs)) is not None), None)


def _newest_rows(c: Claim, runs: list[tuple[str, list[Any]]]) -> list[tuple[str, list[Any]]]:
    """Each run's rows whose ``row_key`` no newer run measured (status "ok"), runs newest first."""
    assert c.row_key is not None
    seen: set[tuple] = set()
    out = []
    for rel, recs in runs:
        keys = [c.row_key(r) for r in recs]
        out.append((rel, [r for r, k in zip(recs, keys) if k not in seen]))
        seen.update(k for r, k in zip(recs, keys) if r.get("status") == "ok")
    return out


def _best_row_hit(c: Claim, runs: list[tuple[str, list[Any]]]) -> tuple[str, float] | None:
    """(folder, value) of the best value over the runs (newest first), each run read on the rows whose
    ``row_key`` no newer run measured (status "ok"): a later run of other tree sizes, or one that skipped or
    failed a size, does not hide an earlier size's best, and one that re-measures a size replaces it."""
    assert c.read is not None
    hits = [(rel, v) for rel, recs in _newest_rows(c, runs) if (v := c.read(recs)) is not None]
    if not hits:
        return None
    measured = [h for h in hits if not math.isnan(h[1])] or hits
    return (min if c.judge == "at_most" else max)(measured, key=lambda h: h[1])


def _range_hit(c: Claim, runs: list[tuple[str, list[Any]]]) -> tuple[str, float, float, str] | None:
    """(folders, lowest, highest, what) over the sizes (``c.size``) of the rows each from its newest run,
    each size read at its best (the reader over that size's rows); None when no size holds a value."""
    assert c.read is not None and c.size is not None
    per_size: dict[Any, tuple[float, str]] = {}
    for rel, recs in _newest_rows(c, runs):
        sizes: dict[Any, list[Any]] = {}
        for r in recs:
            sizes.setdefault(c.size(r), []).append(r)
        for size, rows in sizes.items():
            v = c.read(rows)
            if v is not None and not math.isnan(v) and (size not in per_size or v > per_size[size][0]):
                per_size[size] = (v, rel)
    if not per_size:
        return None
    lo, hi = min(v for v, _ in per_size.values()), max(v for v, _ in per_size.values())
    sources = list(dict.fromkeys(rel for _, rel in sorted(per_size.values(), reverse=True)))
    order = sorted(per_size, key=lambda k: [(-1, "") if x is None else (0, x) for x in k])
    sizes_text = ", ".join("/".join(str(x) for x in k) for k in order)
    return ", ".join(sources), lo, hi, f"measured {lo:.2f}-{hi:.2f} over (T/depth) {sizes_text}"


def _cards(results: Path, sources: str) -> str:
    """The GPU models (``H100``, ``H200``: the CUDA device name without its vendor and memory) of the
    runs a claim's value came from (``sources``: folders joined by ", "), in order, each once."""
    from repro.reporting.rundir import read_manifest

    cards = []
    for rel in sources.split(", "):
        name = (read_manifest(results / rel).get("device_info") or {}).get("cuda") or "CPU"
        cards.append(name.removeprefix("NVIDIA ").split(" ")[0])
    return " and ".join(dict.fromkeys(cards))


def ledger(results: Path, claims: tuple[Claim, ...] = CLAIMS) -> list[dict[str, Any]]:
    """One row per claim: paper value, command, measured value and its folder, ratio, verdict (a range
    claim: also ``paper_high``, ``measured_high``, ``ratio_high``)."""
    papers = {p: yaml.safe_load((BASELINES / f"{p}.yaml").read_text()) for p in {c.paper for c in claims}}
    rows = []
    for c in claims:
        paper = c.value(papers[c.paper])
        paper_high = c.high(papers[c.paper]) if c.high else None
        row = {"id": c.id, "paper": c.paper, "claim": c.statement, "baseline": f"{c.paper}.yaml {c.key}",
               "paper_value": paper, "paper_high": paper_high, "command": c.command, "measured": None,
               "measured_high": None, "source": None, "ratio": None, "ratio_high": None}  # fmt: skip
        if c.kind is None:
            row["verdict"] = f"not testable here: {c.note}"
            rows.append(row)
            continue
        runs = latest_runs(results, c.kind, c.gpu_only, c.conditions) if c.read is not None else []
        runs = without_superseded_parts(c, runs, partly_superseded(results, c.kind)) if runs else runs
        high, said = None, None
        if c.judge == "range":
            ranged = _range_hit(c, runs)
            hit = None if ranged is None else ranged[:2]
            if ranged is not None:
                high, said = ranged[2], ranged[3]
        else:
            hit = _best_row_hit(c, runs) if c.row_key else _latest_hit(c, runs)
        if hit is None:
            why = "no run on the GPU engine yet; CPU and eager tokens/s time Python" if c.gpu_only else c.note
            if c.conditions:
                setting = ", ".join(f"{k}={v}" for k, v in c.conditions)
                why = f"{setting} runs only" + (f"; {why}" if why else "")
            row["verdict"] = "not yet measured" + (f" ({why})" if why else "")
            rows.append(row)
            continue
        row["source"], row["measured"] = hit
        row["ratio"] = hit[1] / paper if paper else None
        if high is not None:
            row["measured_high"] = high
            row["ratio_high"] = high / paper_high if paper_high else None
        note = c.note.replace("{card}", _cards(results, hit[0]))
        row["verdict"] = verdict(c, paper, hit[1], high, paper_high) + (f" ({note})" if note else "")
        if said is None and c.caveat:
            said = c.caveat(dict(runs)[hit[0]])
        row["verdict"] += f"; {said}" if said else ""
        rows.append(row)
    return rows


def _num(v: float | None, high: float | None = None, sep: str = "-") -> str:
    """A number (``never`` for inf), or a range ``low-high``; ``-`` for None and NaN."""
    if v is None or math.isnan(v):
        return "-"
    text = "never" if math.isinf(v) else f"{v:.3g}"
    return text if high is None else f"{text}{sep}{_num(high)}"


def claims_markdown(results: str | Path) -> str:
    """CLAIMS.md's text, from the committed results alone."""
    results = Path(results)
    if not results.is_dir():
        raise ReproError(not_a_folder(results, "results folder"))
    rows = ledger(results)
    lines = [
        LEDGER_HEADING,
        "",
        "Generated by `repro claims` from `baselines/` and the committed run directories under `results/`"
        " (their records; nothing is re-measured); do not edit by hand. Measured = the latest folder of"
        " the claim's result kind, run under the claim's conditions (the paper's temperature, dtype, tree"
        " budget: named in the verdict), that holds the value (a range: each size's latest row, at its best"
        " kernel; the lowest and highest size); ratio = measured / paper. Reproduced means within 10% of"
        " the paper's value in the claim's direction (kernel times: at most; gains and speedups: at least;"
        " both ends of a published range reached; the pool mass within 1%; the break-even p within 15%"
        " either way at every draft length), on the hardware and models named in the verdict; not"
        " measured: the run holds the row but no number (NaN). `repro claims --check` exits 3 when a"
        " verdict differs from this file.",
        "",
        "| id | claim | paper | measured | ratio | verdict | source | command |",
        "|---|---|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        src = ", ".join(f"`{x}`" for x in r["source"].split(", ")) if r["source"] else "-"
        pairs = (("paper_value", "paper_high"), ("measured", "measured_high"), ("ratio", "ratio_high"))
        nums = " | ".join(_num(r[k], r[h], " / " if k == "ratio" else "-") for k, h in pairs)
        lines.append(f"| {r['id']} | {r['claim']} | {nums} | {r['verdict']} | {src} | `{r['command']}` |")
    counts: dict[str, int] = {}
    for r in rows:
        head = r["verdict"].split(" (")[0].split(":")[0]
        counts[head] = counts.get(head, 0) + 1
    lines += ["", "Totals: " + ", ".join(f"{v} {k}" for k, v in counts.items()) + "."]
    return "\n".join(lines) + "\n"


def verdict_heads(text: str) -> dict[str, str]:
    """id -> verdict head (reproduced / not reproduced / not measured / ...) of a CLAIMS.md text."""
    heads = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 8 and cells[0] not in ("id", "---") and not cells[0].startswith("-"):
            heads[cells[0]] = cells[5].split(" (")[0].split(":")[0].split(";")[0]
    return heads


def verdict_changes(old: str, new: str) -> list[str]:
    """``id: old -> new`` for every claim whose verdict head differs between two CLAIMS.md texts (a claim
    present in one only: ``absent``)."""
    a, b = verdict_heads(old), verdict_heads(new)
    return [
        f"{i}: {a.get(i, 'absent')} -> {b.get(i, 'absent')}"
        for i in dict.fromkeys([*a, *b]) if a.get(i) != b.get(i)
    ]  # fmt: skip


def write_claims(results: str | Path, out: str | Path | None = None) -> str:
    """Write ``out`` (default ``results/CLAIMS.md``; an existing file only over an earlier ledger); returns
    its text."""
    from repro.reporting.rundir import check_overwrite

    path = Path(out) if out is not None else Path(results) / "CLAIMS.md"
    check_overwrite(path, LEDGER_HEADING)
    text = claims_markdown(results)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ReproError(f"cannot write {path}: {e.strerror or e}") from None
    return text
