"""The claims ledger (``repro claims``): every published claim of ``baselines/`` beside the latest value
measured in ``results/``, the ratio and a verdict, written to ``results/CLAIMS.md``.

Nothing is measured here: values are read from the committed run directories' records (the latest
folder of the claim's result kind, by manifest ``created_at``, that is not wholly superseded in
``supersedes.json`` and holds a matching record; a claim read at its best row over tree sizes takes each
row from the newest run holding it, ``Claim.row_key``). Each claim is one row of :data:`CLAIMS`: its id,
where the paper's value sits in ``baselines/``, the command that tests it, the result kind and a
reader (records -> value or None), and how the value is judged (``at_least`` / ``at_most`` the paper's
value within ``tolerance``, relative). A claim whose result kind has no folder yet reads "not yet
measured"; one that this harness cannot test says why.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from repro.errors import ReproError

BASELINES = Path(__file__).resolve().parents[2] / "baselines"
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


# ----------------------------------------------------------------------------------- readers


def _family_gain(route: str, base: str, target: str = "tiny-qwen35") -> Reader:
    """Relative MAL gain of ``route`` over ``base`` (pooled prompt sets) in a family report."""

    def read(records: list[dict]) -> float | None:
        from repro.harness.family_report import ALL, flat_table

        t = flat_table(records)
        t = t[(t["target"] == target) & (t["prompt_set"] == ALL)].set_index("route")
        if route not in t.index or base not in t.index:
            return None
        return float(t.loc[route, "mal"] / t.loc[base, "mal"] - 1)

    return read


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
    """A kernel bench row's identity: shape, group, tree kind and size, method, dtype."""
    return tuple(r.get(k) for k in ("shape", "group", "kind", "T", "method", "dtype"))


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
    per sequence is the paper's interactivity)."""

    def read(records: list[Any]) -> float | None:
        from repro.paper.table2 import tables

        t, _ = tables(records)
        t = t[(t["workload"] == workload) & (t["protocol"] == protocol)].set_index("method")
        if method not in t.index or base not in t.index:
            return None
        return float(t.loc[method, "tokens_per_s"] / t.loc[base, "tokens_per_s"] - 1)

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
        return float(hit["speedup"].iloc[0]) if len(hit) and not math.isnan(hit["speedup"].iloc[0]) else None

    return read


def _one_draw(records: list[Any]) -> str | None:
    """A scale run whose replayed routes' prompts all replayed the same acceptance draws (records without
    ``acceptance_seed``, before repro.bench.scale.acceptance_seed): its MALs are one sample each."""
    replayed = [r for r in records if r.get("status") == "ok" and r.get("acceptance")]
    if replayed and not any("acceptance_seed" in r for r in replayed):
        return "one acceptance draw replayed for all its prompts: each MAL one sample; re-run pending"
    return None


def _break_even_p(records: list[Any]) -> float | None:
    """The p above which every draft length of the acceptance study is profitable: the largest break-even
    p over k (None when some k never breaks even)."""
    from repro.reporting.report import acceptance_table, break_even_p

    acc = acceptance_table(records)
    if acc.empty:
        return None
    found = break_even_p(acc, kind="synthetic_chain")
    return None if not found or None in found.values() else max(found.values())


def _first(section: str, i: int, field: str = "value") -> Callable[[dict], float]:
    return lambda b: float(b[section][i][field])


def _kernel_row(t: int, field: str) -> Callable[[dict], float]:
    return lambda b: float(
        next(r for r in b["gdn_tree_verify_kernel"]["rows"] if r["tree_nodes"] == t)[field]
    )


TREE_KERNELS = (
    "tree_fused",
    "tree_split",
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
H200 = "H200, not the paper's B200"
TABLE2, SPECLA = "repro run table2", "repro run specla"
SCALE = "repro bench scale --shape qwen3.6-27b,gdn-1.3b --acceptance paper-mal"
REPLAYED = "random weights at the paper's shape on an H200, the paper's MAL replayed: is the speedup "
REPLAYED += "consistent with the claimed MAL on this hardware; not a real-checkpoint number"
CLAIMS: tuple[Claim, ...] = (
    Claim("W1", "weaver", "end_to_end[0]", _first("end_to_end", 0), "DFlash-TfM 4.37x over AR (Table 2)",
          TABLE2, "paper-table2", _table2_speedup("DFlash-TfM"), note="best-of protocol, all workloads",
          gpu_only=True),
    Claim("W1-scale", "weaver", "end_to_end[0]", _first("end_to_end", 0),
          "DFlash-TfM 4.37x over AR at the Qwen3.6-27B shape (MAL replayed)", SCALE, "bench-scale",
          _scale_speedup("qwen3.6-27b", "dflash_tfm"), note=REPLAYED, gpu_only=True, caveat=_one_draw),
    Claim("W2", "weaver", "end_to_end[1]", _first("end_to_end", 1), "+24.7% interactivity over DFlash",
          TABLE2, "paper-table2", _table2_gain("DFlash-TfM", "DFlash (chain)"),
          note="tokens/s per sequence over chain DFlash, best-of protocol, all workloads", gpu_only=True),
    Claim("W3", "weaver", "end_to_end[2]", _first("end_to_end", 2), "MAL +77% vs chain DFlash (budget 64)",
          "repro family report", "family-report", _family_gain("weaver", "dflash_chain"), note=TINY),
    Claim("W4", "weaver", "end_to_end[3]", _first("end_to_end", 3), "MAL +32% vs DDTree (same tree size)",
          "repro family report", "family-report", _family_gain("weaver", "ddtree"), note=TINY),
    Claim("W5", "weaver", "pool[0]", _first("pool", 0), "top-512 pool keeps 97.8% of the verifier's mass",
          "repro falsify --pool-mass", "falsify-pool-mass", _pool_kept(512), tolerance=0.01, note=TINY_MODEL),
    Claim("W6", "weaver", "pool[1]", _first("pool", 1), "Weaver adapter of 56.7M parameters", "-", None,
          note="a model size, not a measurement; the embedded adapter is a tiny stand-in"),
    *(
        Claim(f"W7-T{t}", "weaver", f"gdn_tree_verify_kernel.rows[T={t}].tree_kernel_us",
              _kernel_row(t, "tree_kernel_us"), f"tree-verify kernel, {t} nodes, us/layer (lower is better)",
              "repro bench kernels --shapes weaver", "bench-kernels",
              _kernel("weaver", "verify", TREE_KERNELS, "us_graph", t), judge="at_most", note=H200)
        for t in (16, 32, 64, 128)
    ),
    *(
        Claim(f"W8-T{t}", "weaver", f"gdn_tree_verify_kernel.rows[T={t}].speedup",
              _kernel_row(t, "speedup"), f"tree kernel over per-branch verification, {t} nodes",
              "repro bench kernels --shapes weaver", "bench-kernels",
              _kernel("weaver", "verify", TREE_KERNELS, "speedup_graph", t), note=H200)
        for t in (16, 32, 64, 128)
    ),
    Claim("W9", "weaver", "gdn_tree_verify_kernel.production[0]", lambda b: 87.0,
          "production tree of 129 nodes, 87 us/layer", "repro bench kernels --shapes weaver", None,
          note="no 129-node production tree is benchmarked (T = 16..256 powers of two)"),
    Claim("S1", "specla", "end_to_end[0]", _first("end_to_end", 0), "1.42x over AR (mixed suite)", SPECLA,
          "paper-specla", _specla_speedup("mixed"), gpu_only=True),
    Claim("S2", "specla", "end_to_end[1]", _first("end_to_end", 1), "1.70x over AR (GSM8K)", SPECLA,
          "paper-specla", _specla_speedup("gsm8k"), gpu_only=True),
    Claim("S3", "specla", "end_to_end[2]", _first("end_to_end", 2), "1.06x over AR (HumanEval)", SPECLA,
          "paper-specla", _specla_speedup("humaneval"), gpu_only=True),
    Claim("S1-scale", "specla", "end_to_end[0]", _first("end_to_end", 0),
          "SpecLA 1.42x over AR at the GDN-1.3B shape (MAL replayed)", SCALE, "bench-scale",
          _scale_speedup("gdn-1.3b", "specla"), note=REPLAYED, gpu_only=True, caveat=_one_draw),
    Claim("S4", "specla", "microbenchmarks[0].low", _first("microbenchmarks", 0, "low"),
          "tree verification 1.8-7.1x over root-to-leaf replay (low end; best T)",
          "repro bench kernels --shapes specla", "bench-kernels",
          _kernel("specla", "verify", TREE_KERNELS, "speedup_graph"), tolerance=0.0,
          note="H200, not the paper's H100", row_key=_kernel_row_key),
    Claim("S5", "specla", "microbenchmarks[1].low", _first("microbenchmarks", 1, "low"),
          "accepted-state recovery 2.74-4.28x over token replay (low end; best row, CUDA graphs)",
          "repro bench kernels", "bench-kernels",
          _kernel("specla", "recovery", COMMIT_KERNELS, "speedup_graph", dtype=None), tolerance=0.0,
          note="H200, not the paper's H100"),
    Claim("S6", "specla", "controlled_acceptance[0]", _first("controlled_acceptance", 0),
          "break-even acceptance probability ~0.7", "repro run acceptance --device cuda", "paper-acceptance",
          _break_even_p, judge="about", tolerance=0.15, gpu_only=True,
          note="tiny family on the H200 graphed engine; largest break-even p over k = 2, 4, 8"),
)  # fmt: skip


# ----------------------------------------------------------------------------------- reading


def latest_runs(results: Path, kind: str, gpu_only: bool = False) -> list[tuple[str, list[Any]]]:
    """(folder relative to ``results``, records) of every run of ``kind`` there, newest first, without
    the wholly superseded ones (``gpu_only``: only runs on a CUDA device with the graphed engine)."""
    from repro.harness.run_kinds import load_run
    from repro.reporting.index import run_folders
    from repro.reporting.rundir import infer_kind, read_manifest

    sup_path = results / "supersedes.json"
    sup = json.loads(sup_path.read_text())["superseded"] if sup_path.is_file() else {}
    found = []
    for folder in run_folders(results):
        rel = folder.relative_to(results).as_posix()
        manifest = read_manifest(folder)
        if infer_kind(manifest) != kind or (rel in sup and not sup[rel].get("partly")):
            continue
        engine = str((manifest.get("config") or {}).get("engine") or "")
        on_gpu_engine = (manifest.get("device_info") or {}).get("cuda") and engine.split(" ")[0] == "graphed"
        if gpu_only and not on_gpu_engine:
            continue
        found.append((manifest.get("created_at", ""), rel, folder))
    found.sort(reverse=True)
    return [(rel, load_run(folder).records) for _, rel, folder in found]


def verdict(claim: Claim, paper: float, measured: float) -> str:
    """reproduced / not reproduced, by ``claim.judge`` within ``claim.tolerance`` (relative)."""
    if math.isnan(measured):
        return "not reproduced"
    if claim.judge == "about":
        ok = abs(measured - paper) <= abs(paper) * claim.tolerance
    elif claim.judge == "at_most":
        ok = measured <= paper * (1 + claim.tolerance)
    else:
        ok = measured >= paper * (1 - claim.tolerance)
    return "reproduced" if ok else "not reproduced"


def _latest_hit(c: Claim, runs: list[tuple[str, list[Any]]]) -> tuple[str, float] | None:
    """(folder, value) from the newest run whose records hold the claim's value."""
    assert c.read is not None
    return next(((rel, v) for rel, recs in runs if (v := c.read(recs)) is not None), None)


def _best_row_hit(c: Claim, runs: list[tuple[str, list[Any]]]) -> tuple[str, float] | None:
    """(folder, value) of the best value over the runs (newest first), each run read on the rows whose
    ``row_key`` no newer run measured (status "ok"): a later run of other tree sizes, or one that skipped or
    failed a size, does not hide an earlier size's best, and one that re-measures a size replaces it."""
    assert c.read is not None and c.row_key is not None
    seen: set[tuple] = set()
    hits = []
    for rel, recs in runs:
        keys = [c.row_key(r) for r in recs]
        if (v := c.read([r for r, k in zip(recs, keys) if k not in seen])) is not None:
            hits.append((rel, v))
        seen.update(k for r, k in zip(recs, keys) if r.get("status") == "ok")
    if not hits:
        return None
    return (min if c.judge == "at_most" else max)(hits, key=lambda h: h[1])


def ledger(results: Path, claims: tuple[Claim, ...] = CLAIMS) -> list[dict[str, Any]]:
    """One row per claim: paper value, command, measured value and its folder, ratio, verdict."""
    papers = {p: yaml.safe_load((BASELINES / f"{p}.yaml").read_text()) for p in {c.paper for c in claims}}
    rows = []
    for c in claims:
        paper = c.value(papers[c.paper])
        row = {"id": c.id, "paper": c.paper, "claim": c.statement, "baseline": f"{c.paper}.yaml {c.key}",
               "paper_value": paper, "command": c.command, "measured": None, "source": None,
               "ratio": None}  # fmt: skip
        if c.kind is None:
            row["verdict"] = f"not testable here: {c.note}"
        else:
            runs = latest_runs(results, c.kind, c.gpu_only) if c.read is not None else []
            hit = _best_row_hit(c, runs) if c.row_key else _latest_hit(c, runs)
            if hit is None:
                why = (
                    "no run on the GPU engine yet; CPU and eager tokens/s time Python"
                    if c.gpu_only
                    else c.note
                )
                row["verdict"] = "not yet measured" + (f" ({why})" if why else "")
            else:
                row["source"], row["measured"] = hit
                row["ratio"] = hit[1] / paper if paper else None
                row["verdict"] = verdict(c, paper, hit[1]) + (f" ({c.note})" if c.note else "")
                said = c.caveat(dict(runs)[hit[0]]) if c.caveat else None
                row["verdict"] += f"; {said}" if said else ""
        rows.append(row)
    return rows


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def claims_markdown(results: str | Path) -> str:
    """CLAIMS.md's text, from the committed results alone."""
    results = Path(results)
    if not results.is_dir():
        raise ReproError(f"results folder {results} does not exist")
    rows = ledger(results)
    lines = [
        "# Claims ledger",
        "",
        "Generated by `repro claims` from `baselines/` and the committed run directories under `results/`"
        " (their records; nothing is re-measured); do not edit by hand. Measured = the latest folder of"
        " the claim's result kind that holds the value (a range read at its best tree size: the best over"
        " each size's latest row); ratio = measured / paper. Reproduced means within"
        " 10% of the paper's value in the claim's direction (kernel times: at most; gains and speedups: at"
        " least; the low end of a published range and the pool mass: reached, within 1% for the pool"
        " mass), on the hardware and models named in the verdict.",
        "",
        "| id | claim | paper | measured | ratio | verdict | source | command |",
        "|---|---|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        src = f"`{r['source']}`" if r["source"] else "-"
        nums = " | ".join(_num(r[k]) for k in ("paper_value", "measured", "ratio"))
        lines.append(f"| {r['id']} | {r['claim']} | {nums} | {r['verdict']} | {src} | `{r['command']}` |")
    counts: dict[str, int] = {}
    for r in rows:
        head = r["verdict"].split(" (")[0].split(":")[0]
        counts[head] = counts.get(head, 0) + 1
    lines += ["", "Totals: " + ", ".join(f"{v} {k}" for k, v in counts.items()) + "."]
    return "\n".join(lines) + "\n"


def write_claims(results: str | Path, out: str | Path | None = None) -> str:
    """Write ``out`` (default ``results/CLAIMS.md``); returns its text."""
    text = claims_markdown(results)
    path = Path(out) if out is not None else Path(results) / "CLAIMS.md"
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ReproError(f"cannot write {path}: {e.strerror or e}") from None
    return text
