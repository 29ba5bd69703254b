"""Held-out acceptance of the embedded trained family (``repro family report``).

For each shipped target and each prompt set (seeded windows of the corpus's held-out split; turn 1
of each suite through the chat template) the target's own family drafters are decoded greedily on
the routes AR, dflash_chain, eagle_chain, ddtree, eagle_tree and weaver by
:func:`repro.harness.evaluation.route_acceptance`: MAL, steps, per-depth acceptance, losslessness
against AR and the engine's per-step stage times. Writes a family-report run directory
(:mod:`repro.reporting.rundir`): records.jsonl (one row per target x prompt set x route, as each set
finishes), manifest.json, table.csv, report.md and a figure.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from repro.data.suites import canonical_suite, load_suite
from repro.decoding.engine import STAGES
from repro.errors import ConfigError, ReproError
from repro.models.family import TARGETS, drafter_name, index
from repro.models.target import open_target, resolve_dtype
from repro.models.tokenizer import Tokenizer
from repro.reporting.records import build_manifest
from repro.reporting.rundir import Run, RunDir, RunKind, check_figures_dir, fields_parser

HELDOUT = "heldout"
DEFAULT_SUITES = ("mt_bench", "gsm8k", "humaneval")
ROUTES = ("ar", "dflash_chain", "eagle_chain", "ddtree", "eagle_tree", "weaver")
TREE_ROUTES = ("ddtree", "eagle_tree", "weaver")
MAX_DEPTH = 15  # DFlash block 16: the deepest draft any route here can propose
ALL = "all"
FIGURE = "depth_acceptance.png"
STAGES_SHOWN = ("draft", "verify")
COUNTS = ("prompts", "prompt_len", "limit", "new_tokens", "budget", "width", "block_size", "eagle_k")


@dataclass
class FamilyReportConfig:
    """What ``repro family report`` evaluates; ``figures`` defaults to ``<out>/figures``."""

    out: str
    figures: str
    corpus: str | None
    targets: list[str] = field(default_factory=lambda: list(TARGETS))
    suites: list[str] = field(default_factory=lambda: list(DEFAULT_SUITES))
    prompts: int = 8
    prompt_len: int = 64
    limit: int = 4
    new_tokens: int = 64
    budget: int = 32
    width: int = 4
    block_size: int = 16
    eagle_k: int = 6
    dtype: str = "float64"
    seed: int = 0
    device: str = "cpu"

    @property
    def heldout(self) -> Path | None:
        """The held-out corpus file ``corpus`` names (None without ``corpus``), whether or not it exists."""
        return Path(self.corpus) / "heldout.txt" if self.corpus else None

    def check(self) -> None:
        """One-line ConfigError/SuiteError for an unknown target, suite or dtype, a count < 1, or nothing
        to evaluate (no suite and no held-out corpus)."""
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise ConfigError(
                f"unknown target(s) {', '.join(unknown) or '(none)'}: "
                f"the family's targets are {', '.join(TARGETS)}"
            )
        self.suites = [canonical_suite(s) for s in self.suites]
        if not self.suites and not (self.heldout and self.heldout.is_file()):
            raise ConfigError("nothing to evaluate: --suites names none and there is no held-out corpus")
        resolve_dtype(self.dtype)
        for name in COUNTS:
            if getattr(self, name) < 1:
                option = "max-new-tokens" if name == "new_tokens" else name.replace("_", "-")
                raise ConfigError(f"--{option} must be >= 1, got {getattr(self, name)}")


def default_out_dir() -> Path:
    return Path("results") / f"{datetime.now(timezone.utc):%Y-%m-%d}-family-acceptance"


def route_specs(target: str, budget: int, width: int = 4, block_size: int = 16, eagle_k: int = 6) -> dict:
    """The report's routes over ``target``'s own family drafters, by route name."""
    dflash, eagle, weaver = (drafter_name(target, k) for k in ("dflash", "eagle", "weaver"))
    return {
        "ar": {"kind": "ar"},
        "dflash_chain": {"kind": "dflash_chain", "drafter": dflash, "block_size": block_size},
        "eagle_chain": {"kind": "eagle_chain", "drafter": eagle, "k": eagle_k},
        "ddtree": {"kind": "ddtree", "drafter": dflash, "budget": budget, "block_size": block_size},
        "eagle_tree": {"kind": "eagle_tree", "drafter": eagle, "budget": budget},
        "weaver": {"kind": "weaver", "drafter": dflash, "weaver": weaver, "budget": budget, "width": width},
    }


def prompt_sets(tok: Tokenizer, cfg: FamilyReportConfig) -> tuple[dict[str, list[list[int]]], list[str]]:
    """Prompt token ids per set (held-out corpus first, then each suite) and notes on sets left out."""
    from repro.data.corpus_tokens import corpus_prompts, documents

    sets: dict[str, list[list[int]]] = {}
    notes: list[str] = []
    heldout = cfg.heldout
    if heldout is None or not heldout.is_file():
        notes.append(
            f"no held-out corpus: {heldout or '--corpus not given'} is missing (build it with "
            "`repro data corpus`), so only the suites were evaluated"
        )
    else:
        gen = torch.Generator().manual_seed(cfg.seed)
        sets[HELDOUT] = corpus_prompts(tok, documents(heldout), cfg.prompts, cfg.prompt_len, gen)
    for suite in cfg.suites:
        items = load_suite(suite, limit=cfg.limit, seed=cfg.seed)
        sets[suite] = [tok.chat_prompt([{"role": "user", "content": p.turns[0]}]) for p in items]
    return sets, notes


def _family_info(cfg: FamilyReportConfig) -> dict[str, Any]:
    """Per evaluated member: bytes, parameters, git sha and its held-out metric, from family.json."""
    members = index()["members"]
    names = [
        n for t in cfg.targets for n in [t, *(drafter_name(t, k) for k in ("dflash", "eagle", "weaver"))]
    ]
    out = {}
    for name in names:
        entry = members.get(name, {})
        metrics = entry.get("metrics", {})
        out[name] = {
            "bytes": entry.get("bytes"),
            "parameters": metrics.get("parameters"),
            "git_sha": entry.get("git_sha"),
            "heldout_ppl": metrics.get("heldout_ppl"),
        }
    return out


def _layers(model: Any) -> str:
    kinds = model.config.layer_types
    gdn = sum(k == "linear_attention" for k in kinds)
    return f"{gdn} GDN + {len(kinds) - gdn} attention layers" if gdn < len(kinds) else f"{gdn} GDN layers"


def open_run(cfg: FamilyReportConfig) -> RunDir:
    """The family-report run directory of ``cfg.out``: config, environment, family provenance and the
    held-out file's sha256 in its manifest; refuses an existing run or a foreign non-empty folder."""
    manifest = build_manifest(asdict(cfg), seed=cfg.seed)
    manifest["family"] = _family_info(cfg)
    heldout = cfg.heldout
    if heldout is not None and heldout.is_file():
        manifest["heldout_sha256"] = hashlib.sha256(heldout.read_bytes()).hexdigest()
    manifest["notes"], manifest["layers"] = [], {}
    return RunDir(cfg.out, manifest, kind=KIND)


# a target's model, its prompt sets and the notes on sets left out (load_targets)
Loaded = dict[str, tuple[Any, dict[str, list[list[int]]], list[str]]]


def load_targets(cfg: FamilyReportConfig) -> Loaded:
    """Every target with its prompt sets, made before the run directory: a corpus too small for the
    prompts is refused with nothing written."""
    loaded: Loaded = {}
    for target in cfg.targets:
        model, tok = open_target(target, cfg.dtype, cfg.device, seed=cfg.seed)
        loaded[target] = (model, *prompt_sets(tok, cfg))
    return loaded


def evaluate(
    cfg: FamilyReportConfig, run: RunDir, loaded: Loaded, progress: Callable[[str], None] | None = None
) -> int:
    """Decode every (target, prompt set, route) of ``loaded``; rows are appended to ``run`` as each set
    finishes, and the layers of each target and notes on prompt sets left out go to its manifest. Returns
    the rows."""
    from repro.harness.evaluation import route_acceptance

    written = 0
    for target, (model, sets, notes) in loaded.items():
        run.update_manifest(
            layers={**run.manifest["layers"], target: _layers(model)},
            notes=list(dict.fromkeys(run.manifest["notes"] + notes)),
        )
        specs = route_specs(target, cfg.budget, cfg.width, cfg.block_size, cfg.eagle_k)
        for set_name, prompts in sets.items():
            acc = route_acceptance(model, specs, prompts, cfg.new_tokens, cfg.seed, MAX_DEPTH)
            for route, result in acc.items():
                run.append(
                    {
                        "target": target,
                        "prompt_set": set_name,
                        "route": route,
                        "spec": specs[route],
                        "prompts": len(prompts),
                        "prompt_tokens": sum(map(len, prompts)) / len(prompts),
                        "new_tokens": cfg.new_tokens,
                        **result,
                    }
                )
                written += 1
            if progress:
                shown = ", ".join(f"{r} {a['mal']:.2f}" for r, a in acc.items())
                progress(f"{target} {set_name} ({len(prompts)} prompts) MAL: {shown}")
    return written


def flat_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (target, prompt set, route) plus a step-weighted pooled ``all`` row per (target,
    route): MAL, steps, lossless, diverged prompts, nodes verified and ms of each stage per step, and
    acceptance d1..d15."""
    flat = []
    for r in rows:
        item = {k: r[k] for k in ("target", "prompt_set", "route", "prompts", "steps", "mal", "lossless")}
        item.update(diverged=r["diverged"], mean_tree_size=r["mean_tree_size"])
        item.update({f"{k}_ms": r[f"{k}_ms_per_step"] for k in STAGES})
        item.update({f"d{i + 1}": a for i, a in enumerate(r["depth_acceptance"])})
        flat.append(item)
    table = pd.DataFrame(flat)
    weighted = [
        c
        for c in table.columns
        if c in ("mal", "mean_tree_size") or c.endswith("_ms") or (c[0] == "d" and c[1:].isdigit())
    ]
    pooled = []
    for (target, route), g in table.groupby(["target", "route"], sort=False):
        steps = g["steps"].sum()
        item = {"target": target, "prompt_set": ALL, "route": route, "prompts": g["prompts"].sum()}
        item.update(steps=steps, lossless=bool(g["lossless"].all()), diverged=g["diverged"].sum())
        item.update({c: (g[c] * g["steps"]).sum() / max(1, steps) for c in weighted})
        pooled.append(item)
    return pd.concat([table, pd.DataFrame(pooled)], ignore_index=True)[table.columns]


def mal_table(table: pd.DataFrame, target: str) -> pd.DataFrame:
    """Rows = routes; columns = MAL per prompt set and pooled, lossless, nodes verified and draft and
    verify ms per step (pooled)."""
    t = table[table["target"] == target]
    sets = list(dict.fromkeys(t["prompt_set"]))
    out = t.pivot(index="route", columns="prompt_set", values="mal")[sets].reindex(
        list(dict.fromkeys(t["route"]))
    )
    pooled = t[t["prompt_set"] == ALL].set_index("route")
    out["lossless"] = [_lossless_cell(pooled.loc[r]) for r in out.index]
    out["nodes/step"] = pooled["mean_tree_size"]
    for stage in STAGES_SHOWN:
        out[f"{stage} ms/step"] = pooled[f"{stage}_ms"]
    return out.reset_index().rename_axis(columns=None)


def depth_table(table: pd.DataFrame, target: str) -> pd.DataFrame:
    """Rows = the tree routes; columns = pooled acceptance at depths 1..MAX_DEPTH."""
    t = table[(table["target"] == target) & (table["prompt_set"] == ALL) & table["route"].isin(TREE_ROUTES)]
    return t[["route"] + [f"d{d}" for d in range(1, MAX_DEPTH + 1)]].reset_index(drop=True)


def _mal_formats(mals: pd.DataFrame) -> dict[str, str]:
    return {c: "{:.1f}" if c.endswith("/step") else "{:.2f}" for c in mals.columns}


def _lossless_cell(row: pd.Series) -> str:
    return (
        "yes" if row["lossless"] else f"**NO: {int(row['diverged'])}/{int(row['prompts'])} prompts diverged**"
    )


def divergences(table: pd.DataFrame) -> list[str]:
    """``target/set/route (k of n prompts)`` for every per-set row whose output differed from AR's."""
    bad = table[(table["prompt_set"] != ALL) & ~table["lossless"].astype(bool)]
    return [
        f"{r.target}/{r.prompt_set}/{r.route} ({r.diverged} of {r.prompts} prompts)" for r in bad.itertuples()
    ]


def _curves(table: pd.DataFrame) -> pd.DataFrame:
    pooled = table[(table["prompt_set"] == ALL) & (table["route"] != "ar")]
    rows = [
        {"target": r["target"], "route": r["route"], "depth": d, "acceptance": r[f"d{d}"]}
        for _, r in pooled.iterrows()
        for d in range(1, MAX_DEPTH + 1)
    ]
    return pd.DataFrame(rows)


def _about(manifest: dict[str, Any], cfg: dict[str, Any]) -> str:
    fam = manifest["family"]
    targets = "; ".join(
        f"`{t}` ({manifest['layers'][t]}, {fam[t]['parameters'] / 1e6:.2f}M parameters, held-out perplexity "
        f"{fam[t]['heldout_ppl']:.1f})"
        for t in cfg["targets"]
    )
    return (
        "The embedded family (`repro family list`, repro/assets/family/) is a set of tiny models trained "
        f"on the corpus's train split: the target(s) {targets}, and per target a DFlash block drafter "
        f"(block {cfg['block_size']}), an EAGLE drafter and a Weaver adapter over the DFlash pool, "
        "self-distilled from the target's own greedy continuations. Held-out prompts are seeded "
        f"{cfg['prompt_len']}-token windows of the corpus's heldout.txt, which no member trained on; suite "
        "prompts are turn 1 of the frozen suites through the chat template. Decoding is greedy in "
        f"{cfg['dtype']} for exactly {cfg['new_tokens']} new tokens (no stop at end of turn), so every "
        "route must reproduce AR's tokens exactly. The CPU times are mechanics of this harness on this "
        "machine (reference kernels, eager PyTorch), not speed claims."
    )


def report_markdown(table: pd.DataFrame, manifest: dict[str, Any], out_dir: Path, figure: Path | None) -> str:
    """report.md's text: what the family is, the lossless verdict, per target the MAL and depth tables."""
    from repro.reporting.report import markdown_table

    cfg = manifest["config"]
    bad = divergences(table)
    verdict = (
        f"**NOT LOSSLESS: {len(bad)} route(s) diverged from AR's greedy output: {'; '.join(bad)}.**"
        if bad
        else "**Lossless: every route reproduced AR's greedy tokens exactly on every prompt.**"
    )
    sets = [s for s in dict.fromkeys(table["prompt_set"]) if s != ALL]
    lines = [
        f"# Held-out acceptance of the embedded family: {out_dir.name}",
        "",
        _about(manifest, cfg),
        "",
        verdict,
        "",
        f"- prompts per set: {', '.join(f'{s} {n}' for s, n in _counts(table).items())}; "
        f"{cfg['new_tokens']} new tokens; tree budget {cfg['budget']} (Weaver width {cfg['width']}); "
        f"EAGLE chain k={cfg['eagle_k']}; {cfg['dtype']}; seed {cfg['seed']}",
        f"- device: {manifest.get('device')}; git sha {manifest.get('git_sha')}; versions: "
        + ", ".join(f"{k} {v}" for k, v in manifest.get("versions", {}).items()),
        *(f"- note: {n}" for n in manifest.get("notes", [])),
        "",
        "MAL = mean accepted length per verify step, bonus token included (AR = 1); `all` pools every "
        f"prompt set's steps ({', '.join(sets)}). Per-depth acceptance at d = the fraction of verify steps "
        "whose accepted path holds at least d draft tokens. Nodes/step: tree nodes verified per step (root "
        "included). Draft/verify ms per step: the engine's stage "
        "timers, CPU mechanics only. A step cut short by the new-token limit counts only the tokens kept.",
    ]
    for target in dict.fromkeys(table["target"]):
        mals = mal_table(table, target)
        lines += [
            "",
            f"## {target}",
            "",
            markdown_table(mals, _mal_formats(mals)),
            "",
            f"Per-depth acceptance of the tree routes (budget {cfg['budget']}, pooled over prompt sets; "
            "per-set values in table.csv):",
            "",
            markdown_table(depth_table(table, target), {f"d{d}": "{:.2f}" for d in range(1, MAX_DEPTH + 1)}),
        ]
    if figure is not None:
        rel = os.path.relpath(figure, out_dir)
        lines += ["", f"![per-depth acceptance]({rel})", "", f"Figure: {rel} (one panel per target)."]
    return "\n".join(lines) + "\n"


def build_report(run: Run, figures_dir: Path | None) -> str:
    """table.csv, the per-depth figure (in ``figures_dir``) and report.md of a family-report run."""
    from repro.reporting.figures import plot_depth_acceptance

    if not run.records:
        raise ReproError(f"{run.path} holds no records: nothing was evaluated")
    table = flat_table(run.records)
    run.write("table.csv", table.to_csv(index=False))
    figure = plot_depth_acceptance(_curves(table), figures_dir / FIGURE) if figures_dir is not None else None
    text = report_markdown(table, run.manifest, run.path, figure)
    run.write("report.md", text)
    return text


def _counts(table: pd.DataFrame) -> dict[str, int]:
    first = table[(table["route"] == "ar") & (table["prompt_set"] != ALL)]
    return dict(zip(first["prompt_set"], first["prompts"].astype(int)))


def run_family_report(
    cfg: FamilyReportConfig, progress: Callable[[str], None] | None = None
) -> tuple[str, list[str]]:
    """Evaluate into a run directory, then write table.csv, the figure and report.md; returns
    (markdown, divergences)."""
    cfg.check()
    check_figures_dir(Path(cfg.figures), Path(cfg.out))  # bad input: refused before anything is written
    loaded = load_targets(cfg)
    with open_run(cfg) as run:
        if not evaluate(cfg, run, loaded, progress):
            raise ReproError("nothing was evaluated: no prompt sets")
        text = run.write_report(figures=cfg.figures)
        return text, divergences(flat_table(run.records()))


KIND = RunKind(
    "family-report",
    fields_parser("target", "prompt_set", "route", "spec", "mal", "steps", "lossless"),
    build_report,
    ("report.md", "table.csv"),
)
