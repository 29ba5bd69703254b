"""The verdict table of an external check: ``table.csv`` and ``report.md`` from its records alone."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from repro.engines.result import SAMPLED
from repro.reporting.records import divergence_index
from repro.reporting.rundir import Run, RunKind, fields_parser

COLUMNS = (
    "engine", "target", "dtype", "prompts", "verdict_vs_repro_ar", "vs_transformers_ar", "mal", "wall_s",
)  # fmt: skip


def summarize(verdicts: Sequence[str]) -> str:
    """One cell for an engine x target over its prompts: ``lossless (n/n identical)``, ``diverged at
    token k1, k2, ... (m/n prompts)``, or the refusal / not-run reason when every prompt gave it."""
    if not verdicts:
        return "no prompts"
    if all(v == "identical" for v in verdicts):
        return f"lossless ({len(verdicts)}/{len(verdicts)} identical)"
    ks = [divergence_index(v) for v in verdicts]
    if all(v == "identical" or k is not None for v, k in zip(verdicts, ks)):
        hit = [str(k) for k in ks if k is not None]
        return f"diverged at token {', '.join(hit)} ({len(hit)}/{len(verdicts)} prompts)"
    reasons = sorted(set(verdicts))
    return reasons[0] if len(reasons) == 1 else "mixed: " + "; ".join(reasons)


def table_rows(records: Sequence[dict[str, Any]]) -> list[dict]:
    """One row per (engine, target), in the order the records came."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["engine"], r["target"]), []).append(r)
    rows = []
    for (engine, target), rs in groups.items():
        vs_hf = [r["vs_transformers_ar"] for r in rs if r["vs_transformers_ar"] is not None]
        lengths = [a for r in rs for a in (r["accepted_lengths"] or [])]
        rows.append(
            {
                "engine": engine,
                "target": target,
                "dtype": rs[0]["dtype"],
                "prompts": len(rs),
                "verdict_vs_repro_ar": summarize([r["vs_ar"] for r in rs]),
                "vs_transformers_ar": summarize(vs_hf) if vs_hf else "-",
                "mal": _mal(lengths, [r.get("mal") for r in rs]),
                "wall_s": f"{sum(r['wall_s'] for r in rs):.2f}",
                "notes": next((r["notes"] for r in rs if r["notes"]), ""),
            }
        )
    return rows


def _mal(lengths: list[int], engine_mals: list[float | None]) -> str:
    """MAL from per-step accepted lengths, else the mean of the engines' own per-prompt MALs."""
    if lengths:
        return f"{sum(lengths) / len(lengths):.2f}"
    own = [m for m in engine_mals if m is not None]
    return f"{sum(own) / len(own):.2f} (engine's)" if own else "-"


def markdown(rows: Sequence[dict[str, Any]], config: dict[str, Any]) -> str:
    temperature = float(config.get("temperature", 0.0))
    mode = f"Sampling at temperature {temperature:g} (verdict `{SAMPLED}`)" if temperature > 0 else "Greedy"
    head = (
        f"# External decode loops vs repro AR\n\n"
        f"{mode}, {config['dtype']} weights, {config['device']}, {config['max_new_tokens']} new tokens "
        "per prompt "
        f"(stop tokens ignored); suites {', '.join(config['suites'])} (limit {config['limit']}, seed "
        f"{config['seed']}), first turns. Verdict: every prompt's tokens equal repro's AR route (lossless), "
        "the first differing new token (0-based) per diverging prompt, or the implementation's refusal. "
        "`vs_transformers_ar`: the same against transformers' own AR `generate` on the same loaded model, "
        "which separates a loop's error from transformers' float32-internal arithmetic. MAL: mean tokens "
        "per verify step as the loop reports them.\n\n"
    )
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]).replace("|", "/") for c in COLUMNS) + " |" for r in rows]
    notes = sorted({f"- `{r['engine']}` on `{r['target']}`: {r['notes']}" for r in rows if r["notes"]})
    return head + "\n".join(lines) + "\n\nHow each ran:\n\n" + "\n".join(notes) + "\n"


def build_report(run: Run, figures_dir: Path | None) -> str:
    """``table.csv`` and ``report.md`` of an external check, from its records and manifest alone."""
    rows = table_rows(run.records)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[*COLUMNS, "notes"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    run.write("table.csv", buf.getvalue())
    text = markdown(rows, run.manifest["config"])
    run.write("report.md", text)
    return text


KIND = RunKind(
    "falsify-external",
    fields_parser("engine", "target", "suite", "prompt_id", "status", "vs_ar", "output_ids"),
    build_report,
    ("report.md", "table.csv"),
)
