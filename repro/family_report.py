"""`repro family report`: held-out acceptance of the embedded trained family, per target and drafter.

For each target (``tiny-qwen35``, ``tiny-gdn``) and each prompt set (held-out corpus windows, and
turn 1 of each suite through the chat template) the target's own family drafters run as five routes
(DFlash chain, EAGLE chain, DDTree and EAGLE-2 trees, Weaver, the trees at one node budget), greedy,
against AR on the same prompts (``repro.train.distill.route_acceptance``): MAL, per-depth acceptance,
mean tree size, stage times per step and whether every output equals AR's. One JSON line per
target x prompt set x route goes to ``records.jsonl`` as it finishes; ``report.md``, ``table.csv``
and a per-depth acceptance figure follow. In float64 (the default) greedy speculation must reproduce
AR exactly, so any ``lossless: false`` is a bug and is flagged at the top of the report.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from repro.errors import ConfigError
from repro.family import TARGETS, drafter_name, resolve_checkpoint
from repro.records import build_manifest
from repro.report import markdown_table
from repro.suites import canonical_suite, load_suite
from repro.target import open_target
from repro.train.distill import corpus_prompts, route_acceptance
from repro.train.target import documents

MAX_DEPTH = 15  # DFlash block 16: depths 1..15


@dataclass
class FamilyReportConfig:
    """Everything that decides a family report (recorded whole in manifest.json)."""

    out: str
    figures: str
    corpus: str | None = "data/corpus"
    prompts: int = 8  # held-out corpus prompts
    prompt_len: int = 64
    suites: list[str] = field(default_factory=lambda: ["mt_bench", "gsm8k", "humaneval"])
    limit: int = 4  # prompts per suite (turn 1)
    new_tokens: int = 64
    budget: int = 32
    dtype: str = "float64"
    seed: int = 0
    targets: list[str] = field(default_factory=lambda: list(TARGETS))


def route_specs(target: str, budget: int) -> dict[str, dict[str, Any]]:
    """The five drafter routes of ``target``'s family drafters."""
    dflash, eagle = drafter_name(target, "dflash"), drafter_name(target, "eagle")
    return {
        "dflash-chain": {"kind": "dflash_chain", "drafter": dflash},
        "eagle-chain-k6": {"kind": "eagle_chain", "drafter": eagle, "k": 6},
        f"ddtree-b{budget}": {"kind": "ddtree", "drafter": dflash, "budget": budget},
        f"eagle-tree-b{budget}": {"kind": "eagle_tree", "drafter": eagle, "budget": budget},
        f"weaver-b{budget}": {
            "kind": "weaver", "drafter": dflash, "weaver": drafter_name(target, "weaver"), "budget": budget,
        },
    }  # fmt: skip


def prompt_sets(cfg: FamilyReportConfig, tokenizer: Any) -> dict[str, list[list[int]]]:
    """Held-out corpus windows (when the corpus is there) and turn 1 of each suite, chat-formatted."""
    sets: dict[str, list[list[int]]] = {}
    heldout = Path(cfg.corpus) / "heldout.txt" if cfg.corpus else None
    if heldout is not None and heldout.is_file():
        gen = torch.Generator().manual_seed(cfg.seed)
        sets["heldout"] = corpus_prompts(tokenizer, documents(heldout), cfg.prompts, cfg.prompt_len, gen)
    for suite in cfg.suites:
        items = load_suite(suite, cfg.limit, cfg.seed)
        sets[suite] = [tokenizer.chat_prompt([{"role": "user", "content": p.turns[0]}]) for p in items]
    return sets


def check(cfg: FamilyReportConfig) -> FamilyReportConfig:
    """Refuse unknown targets and suites, and sizes that cannot run, with one-line errors."""
    unknown = [t for t in cfg.targets if t not in TARGETS]
    if unknown:
        raise ConfigError(f"unknown family target(s) {', '.join(unknown)}: choose from {', '.join(TARGETS)}")
    cfg.suites = [canonical_suite(s) for s in cfg.suites]
    for name in ("limit", "new_tokens", "budget", "prompts"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
    for target in cfg.targets:
        for kind in ("dflash", "eagle", "weaver"):
            resolve_checkpoint(drafter_name(target, kind), "family drafter")
    return cfg


def run_family_report(cfg: FamilyReportConfig) -> Path:
    """Evaluate every (target, prompt set, route); write records, manifest, report, table, figure."""
    cfg = check(cfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = build_manifest({"report": "family", **asdict(cfg)}, seed=cfg.seed)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    rows: list[dict[str, Any]] = []
    with open(out / "records.jsonl", "w", encoding="utf-8") as f:
        for target in cfg.targets:
            model, tokenizer = open_target(target, dtype=cfg.dtype)
            specs = route_specs(target, cfg.budget)
            for set_name, prompts in prompt_sets(cfg, tokenizer).items():
                results = route_acceptance(model, specs, prompts, cfg.new_tokens, cfg.seed, MAX_DEPTH)
                for route, res in results.items():
                    row = {"target": target, "prompts": set_name, "n_prompts": len(prompts), "route": route}
                    row.update(res)
                    rows.append(row)
                    f.write(json.dumps(row) + "\n")
                    f.flush()
    table = pd.DataFrame(rows)
    table.drop(columns=["depth_acceptance"]).to_csv(out / "table.csv", index=False)
    figure = write_figure(table, Path(cfg.figures))
    (out / "report.md").write_text(render(table, cfg, manifest, figure, out))
    return out


def render(
    table: pd.DataFrame, cfg: FamilyReportConfig, manifest: dict[str, Any], figure: Path, out: Path
) -> str:
    """The markdown report: losslessness first, MAL per route and prompt set, per-depth acceptance."""
    bad = table[~table["lossless"]]
    lines = [
        "# Held-out acceptance of the embedded family",
        "",
        f"- git sha {manifest['git_sha']}; device {manifest['device']}; dtype {cfg.dtype}; seed {cfg.seed}",
        f"- prompt sets: held-out corpus windows ({cfg.prompts} x {cfg.prompt_len} tokens, when the "
        f"corpus is built) and turn 1 of {', '.join(cfg.suites)} ({cfg.limit} each, chat template); "
        f"{cfg.new_tokens} new tokens per prompt, greedy, stop tokens ignored; tree budget {cfg.budget} "
        "draft nodes; Weaver width 4, pool 512",
        "- MAL: tokens per verify step, bonus included (AR = 1). Stage times per step are in records.jsonl "
        "and table.csv: CPU mechanics of a tiny model (Python overhead), not speed claims.",
        "",
        "**Lossless: every route reproduced AR's tokens on every prompt.**"
        if bad.empty
        else f"**NOT LOSSLESS: {len(bad)} route x prompt-set rows differ from AR: "
        + ", ".join(f"{r.target}/{r.prompts}/{r.route}" for r in bad.itertuples())
        + "**",
        "",
    ]
    for target, part in table.groupby("target", sort=False):
        mal = part.pivot(index="route", columns="prompts", values="mal").reindex(part["route"].unique())
        mal = mal[list(part["prompts"].unique())]
        lines += [f"## {target}", "", "MAL per prompt set:", "", _table(mal.round(2)), ""]
        depth = part[part["prompts"] == part["prompts"].iloc[0]]
        acc = pd.DataFrame(
            [r.depth_acceptance[:8] for r in depth.itertuples()],
            index=list(depth["route"]),
            columns=[f"d{d}" for d in range(1, 9)],
        )
        lines += [
            f"Per-depth acceptance on `{depth['prompts'].iloc[0]}` (share of steps whose accepted path "
            "reaches depth d):",
            "",
            _table(acc.round(2)),
            "",
        ]
        size = part.groupby("route", sort=False)[["mean_tree_size"]].mean()
        lines += ["Nodes verified per step (mean over prompt sets):", "", _table(size.round(1)), ""]
    lines += [f"![per-depth acceptance]({os.path.relpath(figure, out)})", ""]
    return "\n".join(lines)


def _table(frame: pd.DataFrame) -> str:
    """A route-indexed frame as a markdown table (the route name as the first column)."""
    return markdown_table(frame.rename_axis("route").reset_index())


def write_figure(table: pd.DataFrame, folder: Path) -> Path:
    """Per-depth acceptance (pooled over prompt sets, weighted by steps), one panel per target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    targets = list(table["target"].unique())
    fig, axes = plt.subplots(1, len(targets), figsize=(5.5 * len(targets), 3.8), squeeze=False)
    for ax, target in zip(axes[0], targets):
        part = table[table["target"] == target]
        for route, rows in part.groupby("route", sort=False):
            weights = rows["steps"].to_numpy(dtype=float)
            curves = torch.tensor(list(rows["depth_acceptance"]), dtype=torch.float64)
            pooled = (curves * torch.tensor(weights)[:, None]).sum(0) / max(weights.sum(), 1.0)
            ax.plot(range(1, MAX_DEPTH + 1), pooled.tolist(), marker="o", ms=3, label=route)
        ax.set_title(target)
        ax.set_xlabel("draft depth d")
        ax.set_ylabel("share of steps reaching d")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = folder / "family_depth_acceptance.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
