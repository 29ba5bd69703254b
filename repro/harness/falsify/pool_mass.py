"""The reviewers' pool check (``repro falsify --pool-mass``), with Fig. 4's oracle bound in the same run.

On the embedded family (a target and its own DFlash drafter and Weaver adapter), on held-out corpus
windows when the corpus exists, else on turn 1 of the suites, each prompt followed by the target's
greedy continuation (teacher-forced):

1. per pool size K and draft depth, the target's probability mass outside DFlash's top-K pool
   (:func:`repro.drafters.pool.outside_mass`): mean, median, 90th percentile (= 1 - the 10th
   percentile of the mass kept) and the share of positions keeping < 90%;
2. the budget-64 DFlash-TfM (``weaver`` route) decode repeated at K and 2K: MAL and tokens/s, verdict
   "immaterial" when both change by < 5%, else "material";
3. the oracle bound of :mod:`repro.harness.falsify.oracle` beside the measured per-depth acceptance of
   ``weaver`` and ``ddtree`` (greedy, and sample_match at temperature 1, the bound's protocol);
4. the falsifier: **refuted** when the mean outside mass at K exceeds ``outside_limit`` (5%) at some
   informative depth AND the weaver route's temperature-1 acceptance at every such depth is at most the
   pure-marginal bound (+ ``margin``); else **not refuted**. A depth is informative when the bound or the
   measured acceptance is at least ``margin`` (both are ~0 deep in the tree).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from repro.errors import ConfigError, ReproError
from repro.reporting.records import build_manifest
from repro.reporting.rundir import Run, RunDir, RunKind, fields_parser

if TYPE_CHECKING:
    from repro.drafters.pool import PoolMass

THRESHOLD = 0.9  # the tail: positions whose pool keeps less than this share of the mass
OUTSIDE_LIMIT = 0.05  # "a few percent" of the mass outside the pool
MATERIAL = 0.05  # a relative change of MAL or tokens/s at 2K this large is material
MARGIN = 0.02  # absolute: "falls to the pure-marginal level" = measured <= bound + MARGIN
POOL_FIGURE, ORACLE_FIGURE = "pool_mass", "oracle_bound"


@dataclass
class PoolCheckConfig:
    """What ``repro falsify --pool-mass`` measures (defaults: small enough for a CPU in minutes)."""

    out: str
    target: str = "tiny-qwen35"
    ks: list[int] = field(default_factory=lambda: [64, 128, 256, 512, 1024, 2048])
    rerun_k: int = 512  # the decode is repeated at K and 2K
    corpus: str | None = "data/corpus"
    prompts: int = 8
    prompt_len: int = 64
    suites: list[str] = field(default_factory=lambda: ["mt_bench", "gsm8k", "humaneval"])
    limit: int = 2
    new_tokens: int = 32
    budget: int = 64
    width: int = 4
    oracle_samples: int = 64
    contexts_per_prompt: int = 2
    outside_limit: float = OUTSIDE_LIMIT
    dtype: str = "float64"
    seed: int = 0
    device: str = "cpu"
    engine: str = "auto"  # the decodes at K and 2K: graphed (CUDA graphs) on CUDA by default

    def check(self) -> None:
        """One-line ConfigError (SuiteError for an unknown suite) for a bad value."""
        from repro.data.suites import canonical_suite
        from repro.models.family import TARGETS

        if self.target not in TARGETS:
            raise ConfigError(f"unknown target {self.target}: the family's targets are {', '.join(TARGETS)}")
        for suite in self.suites:
            canonical_suite(suite)
        if not self.ks or min(self.ks) < 1:
            raise ConfigError(f"--k needs pool sizes >= 1, got {self.ks}")
        for name in ("rerun_k", "prompts", "prompt_len", "limit", "new_tokens", "budget", "width"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.new_tokens < 2:
            raise ConfigError("--max-new-tokens must be >= 2 (anchors lie in the continuation)")
        if self.oracle_samples < 2 or self.contexts_per_prompt < 1:
            raise ConfigError("--oracle-samples must be >= 2 and --contexts-per-prompt >= 1")
        if not 0 < self.outside_limit < 1:
            raise ConfigError(f"--outside-limit must lie in (0, 1), got {self.outside_limit}")
        from repro.models.graphed import check_engine

        check_engine(self.engine)


def relative_change(before: float, after: float) -> float:
    """|after - before| / |before| (NaN when before is 0 or either is NaN)."""
    return abs(after - before) / abs(before) if before and not math.isnan(before + after) else math.nan


def rerun_verdict(mal: tuple[float, float], tps: tuple[float, float], limit: float = MATERIAL) -> str:
    """ "immaterial" when MAL and tokens/s at 2K both change by < ``limit`` relative to K, else
    "material" (an unknown change counts as material)."""
    changes = [relative_change(*mal), relative_change(*tps)]
    return "immaterial" if all(c < limit for c in changes) else "material"


def informative_depths(bound: list[float], measured: list[float], margin: float = MARGIN) -> list[int]:
    """Depths (1 first) where the bound or the measured acceptance is at least ``margin``."""
    return [d for d, (b, m) in enumerate(zip(bound, measured), 1) if max(b, m) >= margin]


def falsifier_verdict(
    outside: list[float],
    bound: list[float],
    measured: list[float],
    limit: float = OUTSIDE_LIMIT,
    margin: float = MARGIN,
) -> tuple[str, list[int]]:
    """("refuted" | "not refuted", the depths that decided it): refuted when at some informative depth
    the mean outside mass exceeds ``limit`` and at every such depth the measured acceptance is at most
    ``bound`` + ``margin``."""
    leaky = [d for d in informative_depths(bound, measured, margin) if outside[d - 1] > limit]
    if not leaky:
        return "not refuted", []
    at_bound = [d for d in leaky if measured[d - 1] <= bound[d - 1] + margin]
    return ("refuted", leaky) if len(at_bound) == len(leaky) else ("not refuted", leaky)


# ------------------------------------------------------------------------------------ measuring


def _prompts(cfg: PoolCheckConfig, tok: Any) -> tuple[str, list[list[int]]]:
    """(what the prompts are, their token ids): held-out corpus windows, else turn 1 of the suites."""
    import torch

    from repro.data.corpus_tokens import corpus_prompts, documents
    from repro.data.suites import load_suite

    heldout = Path(cfg.corpus) / "heldout.txt" if cfg.corpus else None
    if heldout is not None and heldout.is_file():
        gen = torch.Generator().manual_seed(cfg.seed)
        return "heldout", corpus_prompts(tok, documents(heldout), cfg.prompts, cfg.prompt_len, gen)
    prompts = []
    for suite in cfg.suites:
        for p in load_suite(suite, limit=cfg.limit, seed=cfg.seed):
            prompts.append(tok.chat_prompt([{"role": "user", "content": p.turns[0]}]))
    return "suites " + ",".join(cfg.suites), prompts


def mass_line(mass: PoolMass) -> str:
    """One progress line: the mean outside mass at depth 1 and at the deepest depth any position reached
    (a depth no continuation reached has no mean)."""
    reached = [d for d, n in enumerate(mass.positions) if n]
    if not reached:
        return f"K={mass.pool_size}: no positions"
    first, last = reached[0], reached[-1]
    return (
        f"K={mass.pool_size}: mean outside mass {mass.mean_outside[first]:.3f} (depth {first + 1}) .. "
        f"{mass.mean_outside[last]:.3f} (depth {last + 1})"
    )


def measure(cfg: PoolCheckConfig, run: RunDir, progress: Callable[[str], None] | None = None) -> None:
    """Every record of a pool-mass run, appended to ``run`` as it is measured."""
    import torch

    from repro.drafters.dflash import load_dflash
    from repro.drafters.pool import PoolMass, outside_mass
    from repro.harness.evaluation import greedy_continuations, route_acceptance
    from repro.harness.falsify.oracle import marginal_bound
    from repro.models.family import drafter_name
    from repro.models.graphed import GraphedTarget, resolve_engine
    from repro.models.target import open_target

    say = progress or (lambda line: None)
    model, tok = open_target(cfg.target, cfg.dtype, cfg.device, seed=cfg.seed)
    graphed = resolve_engine(cfg.engine, model.device) == "graphed"
    decoder = GraphedTarget(model) if graphed else model
    run.update_manifest(engine="graphed" if graphed else "eager")
    dflash = load_dflash(drafter_name(cfg.target, "dflash"), dtype=model.dtype, device=model.device)
    depth = dflash.config.block_size - 1
    source, prompts = _prompts(cfg, tok)
    run.update_manifest(prompt_source=source, prompts=len(prompts), vocab_size=model.config.vocab_size)
    values: dict[int, list[torch.Tensor]] = {}
    for ids in prompts:  # prompts of different lengths: one sequence at a time
        seq = greedy_continuations(model, [ids], cfg.new_tokens)
        for k, per_depth in outside_mass(model, dflash, seq, cfg.ks, first_anchor=len(ids) - 1).items():
            values[k] = (
                [torch.cat([a, b]) for a, b in zip(values[k], per_depth)] if k in values else per_depth
            )
    for k, per_depth in values.items():
        mass = PoolMass.of(k, per_depth, THRESHOLD)
        for d in range(depth):
            if not mass.positions[d]:  # a continuation shorter than the block reaches no deeper
                continue
            run.append({
                "record": "pool", "k": k, "depth": d + 1, "positions": mass.positions[d],
                "mean_outside": mass.mean_outside[d], "median_outside": mass.median_outside[d],
                "p90_outside": mass.p90_outside[d], "share_below": mass.share_below[d],
            })  # fmt: skip
        say(mass_line(mass))
    weaver = drafter_name(cfg.target, "weaver")
    common = {"drafter": drafter_name(cfg.target, "dflash"), "budget": cfg.budget}
    specs = {
        f"weaver-K{k}": {"kind": "weaver", "weaver": weaver, "width": cfg.width, "pool": k, **common}
        for k in (cfg.rerun_k, 2 * cfg.rerun_k)
    }
    specs["ddtree"] = {"kind": "ddtree", **common}
    for temperature in (0.0, 1.0):
        chosen = (
            specs
            if temperature == 0
            else {n: s for n, s in specs.items() if n != f"weaver-K{2 * cfg.rerun_k}"}
        )
        acc = route_acceptance(
            decoder, chosen, prompts, cfg.new_tokens, cfg.seed, depth, temperature=temperature
        )
        for name, result in acc.items():
            run.append({"record": "route", "route": name, "spec": chosen[name], "temperature": temperature,
                        "prompts": len(prompts), **result})  # fmt: skip
        say(f"T={temperature:g}: " + ", ".join(f"{n} MAL {r['mal']:.2f}" for n, r in acc.items()))
    contexts = []
    stride = max(1, cfg.new_tokens // cfg.contexts_per_prompt)
    for ids in prompts:
        seq = greedy_continuations(model, [ids], cfg.new_tokens)[0].tolist()
        contexts += [seq[: len(ids) + o] for o in range(0, cfg.new_tokens, stride)][: cfg.contexts_per_prompt]
    bound = marginal_bound(model, contexts, depth, cfg.oracle_samples, cfg.seed)
    run.append({"record": "oracle", **asdict(bound), "bound": bound.bound})
    say(
        f"oracle bound over {bound.contexts} contexts x {bound.samples} samples: depth 1 {bound.bound[0]:.3f}"
    )


def open_run(cfg: PoolCheckConfig) -> RunDir:
    """The run directory of a pool-mass check (refuses an existing run or a foreign folder)."""
    from repro.models.family import drafter_name, index

    members = index()["members"]
    names = [cfg.target, *(drafter_name(cfg.target, k) for k in ("dflash", "weaver"))]
    manifest = build_manifest(asdict(cfg), seed=cfg.seed)
    manifest["family"] = {n: members.get(n, {}).get("git_sha") for n in names}
    return RunDir(cfg.out, manifest, kind=KIND)


def run_pool_check(cfg: PoolCheckConfig, progress: Callable[[str], None] | None = None) -> tuple[str, dict]:
    """Measure into ``cfg.out`` and write the report; returns (markdown, verdicts)."""
    cfg.check()
    with open_run(cfg) as run:
        measure(cfg, run, progress)
        text = run.write_report()
        return text, verdicts(run.records(), run.manifest["config"])


# ------------------------------------------------------------------------------------ reporting


def pool_table(records: list[dict]) -> pd.DataFrame:
    """One row per (K, depth): positions, outside mass mean / median / p90, share keeping < 90%."""
    cols = ["k", "depth", "positions", "mean_outside", "median_outside", "p90_outside", "share_below"]
    return pd.DataFrame([{c: r[c] for c in cols} for r in records if r["record"] == "pool"], columns=cols)


def routes(records: list[dict], temperature: float) -> dict[str, dict]:
    return {r["route"]: r for r in records if r["record"] == "route" and r["temperature"] == temperature}


def oracle_record(records: list[dict]) -> dict:
    found = [r for r in records if r["record"] == "oracle"]
    if not found:
        raise ReproError("the pool-mass run holds no oracle record (interrupted before the bound)")
    return found[-1]


def rerun_table(records: list[dict], k: int) -> pd.DataFrame:
    """The budget-64 weaver decode at K and 2K (greedy): MAL, tokens/s, their relative change."""
    greedy = routes(records, 0.0)
    a, b = greedy[f"weaver-K{k}"], greedy[f"weaver-K{2 * k}"]
    rows = [
        {
            "K": k,
            "mal": a["mal"],
            "tokens_per_s": a["tokens_per_s"],
            "steps": a["steps"],
            "lossless": a["lossless"],
        }
    ]
    rows.append(
        {
            "K": 2 * k,
            "mal": b["mal"],
            "tokens_per_s": b["tokens_per_s"],
            "steps": b["steps"],
            "lossless": b["lossless"],
        }
    )
    table = pd.DataFrame(rows)
    table["mal_change"] = [math.nan, relative_change(a["mal"], b["mal"])]
    table["tps_change"] = [math.nan, relative_change(a["tokens_per_s"], b["tokens_per_s"])]
    return table


def depth_table(records: list[dict], k: int) -> pd.DataFrame:
    """Per depth: the oracle's two curves and bound, weaver / ddtree measured (greedy and T=1), and the
    mean outside mass at K."""
    oracle = oracle_record(records)
    greedy, sampled = routes(records, 0.0), routes(records, 1.0)
    outside = pool_table(records).query("k == @k").set_index("depth")["mean_outside"]
    rows = []
    for d in range(1, len(oracle["bound"]) + 1):
        rows.append({
            "depth": d, "outside_K": outside.get(d, math.nan),
            "oracle_argmax": oracle["argmax"][d - 1], "oracle_sampled": oracle["sampled"][d - 1],
            "bound": oracle["bound"][d - 1],
            "weaver_T1": sampled[f"weaver-K{k}"]["depth_acceptance"][d - 1],
            "ddtree_T1": sampled["ddtree"]["depth_acceptance"][d - 1],
            "weaver_greedy": greedy[f"weaver-K{k}"]["depth_acceptance"][d - 1],
            "ddtree_greedy": greedy["ddtree"]["depth_acceptance"][d - 1],
        })  # fmt: skip
    return pd.DataFrame(rows)


def verdicts(records: list[dict], cfg: dict) -> dict[str, Any]:
    """The rerun verdict and the falsifier's, and the greedy routes that diverged from AR where they
    must not (float64), from the records."""
    k = cfg["rerun_k"]
    rerun = rerun_table(records, k)
    depths = depth_table(records, k)
    verdict, decided = falsifier_verdict(
        depths["outside_K"].tolist(),
        depths["bound"].tolist(),
        depths["weaver_T1"].tolist(),
        cfg["outside_limit"],
    )
    exact = cfg["dtype"] == "float64"  # greedy in float64: speculation is exact, any divergence a bug
    return {
        "rerun": rerun_verdict(tuple(rerun["mal"]), tuple(rerun["tokens_per_s"])),
        "falsifier": verdict,
        "depths": decided,
        "diverged": sorted(name for name, r in routes(records, 0.0).items() if exact and not r["lossless"]),
    }


NAMES = {
    "bound": "marginal bound",
    "oracle_argmax": "argmax of marginals",
    "oracle_sampled": "sampling from marginals",
    "weaver_T1": "weaver (T=1)",
    "ddtree_T1": "ddtree (T=1)",
    "weaver_greedy": "weaver (greedy)",
    "ddtree_greedy": "ddtree (greedy)",
}


def _figures(pools: pd.DataFrame, depths: pd.DataFrame, folder: Path) -> list[Path]:
    """The outside-mass curves per K and the oracle-bound figure (PNG + SVG each)."""
    from repro.reporting.figures import plot_lines

    curves = pools.assign(series=[f"K={v}" for v in pools["k"]])
    labels = ("draft depth", "mean target mass outside the top-K pool", "Mass outside DFlash's top-K pool")
    out = plot_lines(curves, folder / f"{POOL_FIGURE}.png", series="series", x="depth", y="mean_outside",
                     labels=labels)  # fmt: skip
    long = depths.melt(id_vars="depth", value_vars=list(NAMES), var_name="curve", value_name="acceptance")
    long["curve"] = long["curve"].map(NAMES)
    labels = ("draft depth d", "P(accepted path reaches d)", "Marginal-drafter bound vs measured")
    bounds = tuple(list(NAMES.values())[:3])
    return out + plot_lines(long, folder / f"{ORACLE_FIGURE}.png", series="curve", x="depth", y="acceptance",
                            labels=labels, ylim=(0, 1.02), dashed=bounds)  # fmt: skip


def build_report(run: Run, figures_dir: Path | None) -> str:
    """table.csv (outside mass per K and depth), oracle.csv, the two figures and report.md."""
    from repro.reporting.report import markdown_table

    cfg, records = run.manifest["config"], run.records
    k = cfg["rerun_k"]
    pools = pool_table(records)
    run.write("table.csv", pools.to_csv(index=False))
    rerun, depths = rerun_table(records, k), depth_table(records, k)
    run.write("oracle.csv", depths.to_csv(index=False))
    found = verdicts(records, cfg)
    oracle = oracle_record(records)
    figures = []
    if figures_dir is not None:
        figures += _figures(pools, depths, figures_dir)
    pct = {c: "{:.3f}" for c in ("mean_outside", "median_outside", "p90_outside", "share_below")}
    at_k = pools[pools["k"] == k]
    worst = at_k["mean_outside"].max() if len(at_k) else math.nan
    man = run.manifest
    where = cfg["device"] + (f", {man['engine']} engine" if man.get("engine") else "")
    m = oracle["samples"]
    diverged = [f"**Not lossless: greedy route(s) {', '.join(found['diverged'])} diverged from AR.**", ""]
    diverged = diverged if found["diverged"] else []
    lines = [
        f"# Pool mass and the marginal oracle bound: {run.path.name}",
        "",
        f"Target `{cfg['target']}` with its own DFlash drafter and Weaver adapter ({cfg['dtype']},"
        f" {where}); prompts: {man.get('prompt_source')} ({man.get('prompts')} prompts), each"
        f" followed by the target's greedy continuation of {cfg['new_tokens']} tokens, teacher-forced;"
        f" vocabulary {man.get('vocab_size')}. Paper claim (Weaver Sec. 3.2): the top-512 pool keeps"
        " 97.8% of the verifier's mass on held-out data (2.2% outside).",
        "",
        f"**Falsifier: {found['falsifier']}.** Refuted needs the mean mass outside the K={k} pool above"
        f" {cfg['outside_limit']:.0%} at an informative depth AND weaver's temperature-1 acceptance at"
        f" every such depth at most the pure-marginal bound + {MARGIN} (absolute). Largest mean outside"
        f" mass at K={k}: {worst:.3f}; depths deciding: {', '.join(map(str, found['depths'])) or 'none'}.",
        "",
        f"**K vs 2K rerun: {found['rerun']}** (immaterial when MAL and tokens/s both change by <"
        f" {MATERIAL:.0%}; CPU tokens/s of a tiny model time Python, not GPU work).",
        "",
        *diverged,
        "## Mass outside the top-K pool, per K and draft depth",
        "",
        "mean / median / p90 of the target's probability mass outside the pool over positions (p90"
        " outside = 1 - the 10th percentile of the mass kept); share_below: share of positions keeping"
        f" < {THRESHOLD:.0%}.",
        "",
        markdown_table(pools, pct),
        "",
        f"## Budget-{cfg['budget']} weaver decode at K and 2K (greedy, width {cfg['width']})",
        "",
        markdown_table(
            rerun, {"mal": "{:.3f}", "tokens_per_s": "{:.1f}", "mal_change": "{:.1%}", "tps_change": "{:.1%}"}
        ),
        "",
        "## Oracle bound (Fig. 4) beside measured per-depth acceptance",
        "",
        f"True marginals estimated from M = {m} continuations sampled at temperature 1 per context"
        f" ({m // 2} fit the marginals, {m - m // 2} score), {oracle['contexts']} contexts (prompts and"
        " prompts + part of their greedy continuation); bound = the better of argmax-of-marginal and"
        " sampling-from-marginal chains. Measured: the fraction of verify steps whose accepted path"
        " reaches depth d (`route_acceptance`), at temperature 1 (sample_match, the bound's protocol)"
        " and greedy (temperature 0, where a marginal drafter is not bounded below 1: the greedy"
        " continuation is deterministic).",
        "",
        markdown_table(depths, {c: "{:.3f}" for c in depths.columns if c != "depth"}),
    ]
    for f in figures:
        if f.suffix == ".png":
            lines += ["", f"![{f.stem}]({os.path.relpath(f, run.path)})"]
    text = "\n".join(lines) + "\n"
    run.write("report.md", text)
    return text


KIND = RunKind(
    "falsify-pool-mass",
    fields_parser("record"),
    build_report,
    ("report.md", "table.csv", "oracle.csv"),
)
