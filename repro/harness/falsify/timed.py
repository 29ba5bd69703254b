"""What was timed (``repro falsify --what-was-timed RUN_DIR``): SpecLA's reviewers' check 3.

For a decode run directory, per route: the decoder layers the target actually executed per verify
step, **counted** during a short re-run of the run's first prompt with each route on the CPU, on the
engine the run timed: the eager HybridLM (a forward hook on every decoder layer's input norm, per
verify call) or the graphed engine's static decoder (run eagerly on the CPU: its own count of the
layers each of its steps executes, per decode step launched after the prefill); against the model's
layer count; and the full-model per-stage breakdown (draft, tree, verify, commit ms per step) read
from the run's records. A route whose verify executed fewer layers than the model has, or that no
verify was counted for, gets the verdict "single-layer timing, not a model timing" (the command exits
3). External routes (other implementations' loops) are not counted: their rows say so.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from repro.errors import ReproError
from repro.models.graphed import GraphedTarget
from repro.reporting.records import STAGES, build_manifest
from repro.reporting.rundir import Run, RunDir, RunKind, changed_checkpoint, fields_parser

MODEL = "model timing"
SINGLE = "single-layer timing, not a model timing"
EXTERNAL = "external loop: not counted"


def timing_verdict(executed_min: float, model_layers: int) -> str:
    """A timing is a model timing only when every verify executed every layer of the model."""
    return MODEL if executed_min >= model_layers else SINGLE


class LayerCounter:
    """Counts decoder-layer executions inside ``model.verify`` calls made after the prompt's prefill."""

    def __init__(self, model: Any) -> None:
        self.model, self.calls, self.per_verify, self.in_prefill = model, 0, [], False
        self.hooks = [layer.input_layernorm.register_forward_hook(self._hit) for layer in model.model.layers]
        self._verify, self._prefill = model.verify, model.prefill
        model.verify, model.prefill = self._counted_verify, self._counted_prefill

    def _hit(self, *args: Any) -> None:
        self.calls += 1

    def _counted_verify(self, *args: Any, **kwargs: Any) -> Any:
        before = self.calls
        out = self._verify(*args, **kwargs)
        if not self.in_prefill:
            self.per_verify.append(self.calls - before)
        return out

    def _counted_prefill(self, *args: Any, **kwargs: Any) -> Any:
        self.in_prefill = True
        try:
            return self._prefill(*args, **kwargs)
        finally:
            self.in_prefill = False

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()
        del self.model.verify, self.model.prefill  # back to the class's methods


class DecoderCounter:
    """Counts the layers the graphed engine's static decoder executes in the decode steps after the
    prompt's prefill (its ``layer_calls``, kept by the decoder's own layer loop; CPU: no graphs, so every
    step runs that loop)."""

    def __init__(self, target: Any) -> None:
        self.target, self.prefilled = target, 0
        self._prefill = target.prefill
        target.prefill = self._counted_prefill

    def executed(self) -> int:
        return sum(self.target.decoder.layer_calls.values())

    def _counted_prefill(self, *args: Any, **kwargs: Any) -> Any:
        before = self.executed()
        try:
            return self._prefill(*args, **kwargs)
        finally:
            self.prefilled += self.executed() - before

    def close(self) -> None:
        del self.target.prefill  # back to the class's method


def count_layers(
    cfg: dict[str, Any], routes: list[str], new_tokens: int, checkpoints: dict[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """Per route name: layers executed per verify step (mean, min), verify steps counted, the model's
    layers, on the first prompt of ``cfg`` re-run on the CPU with the run's engine (reference GDN path;
    float64 unless float32 was run). On the graphed engine the steps are the decode steps launched
    (``launched_steps``), and the minimum is the mean (the decoder counts layers, not steps).
    ``checkpoints``: the run's recorded fingerprints; checkpoints whose contents changed since are refused
    (ReproError) before anything is counted."""
    from repro.decoding.engine import generate
    from repro.harness.runner import opened_runner
    from repro.models.fingerprint import fingerprint_checkpoints
    from repro.reporting.records import reference_route

    dtype = cfg["dtype"] if cfg["dtype"] in ("float32", "float64") else "float64"
    rerun = {**cfg, "device": "cpu", "gdn_backend": "reference", "dtype": dtype, "warmup": 0}
    rerun["max_new_tokens"] = new_tokens
    with opened_runner(rerun) as runner:  # under the run's engine switches
        if checkpoints:
            resolved = [{**route.params, "name": route.name} for route in runner.all_routes]
            now = fingerprint_checkpoints(str(cfg["target"]), resolved)
            if changed := changed_checkpoint(checkpoints, now):
                raise ReproError(
                    f"the run's checkpoints changed since it ran ({changed}): its routes would be counted on"
                    " other weights; rerun the decode run first"
                )
        chosen = [r for r in runner.routes if r.name in routes]
        prompt = runner.prompts()[0]
        ids = runner.tokenizer.chat_prompt([{"role": "user", "content": prompt.turns[0]}])
        ref_name = reference_route((r.name, r.params) for r in runner.routes)
        ref = next((r for r in runner.routes if r.name == ref_name), None)
        reference = generate(runner.model, ids, ref, new_tokens).output_ids if ref else None
        out = {}
        layers = len(runner.model.model.layers)
        graphed = isinstance(runner.target, GraphedTarget)
        for route in chosen:
            where = {"prompt": f"{prompt.suite}/{prompt.id}", "model_layers": layers}
            if graphed:
                counter = DecoderCounter(runner.target)
                start = counter.executed()
                try:
                    result = generate(runner.target, ids, route, new_tokens, (), reference)
                finally:
                    counter.close()
                steps = result.launched_steps or result.steps
                mean = (counter.executed() - start - counter.prefilled) / steps if steps else math.nan
                counted = {"verify_calls": steps, "layers_per_verify": mean, "layers_min": mean}
                out[route.name] = {**where, **counted}
                continue
            hooks = LayerCounter(runner.model)
            try:
                generate(runner.model, ids, route, new_tokens, (), reference)
            finally:
                hooks.close()
            n = hooks.per_verify
            out[route.name] = {
                **where,
                "verify_calls": len(n),
                "layers_per_verify": sum(n) / len(n) if n else math.nan,
                "layers_min": min(n) if n else math.nan,
            }
        return out


def what_was_timed(src: Run, out: str | Path, new_tokens: int = 8) -> RunDir:
    """Write a what-was-timed run directory for the run ``src`` (read back by the caller, a decode run or
    refused); returns it (closed)."""
    from repro.reporting.report import summarize

    if src.kind.name != "decode":
        raise ReproError(
            f"{src.path} is a {src.kind.name} run; --what-was-timed needs a decode run directory"
        )
    if not src.records:
        raise ReproError(f"{src.path} holds no records: nothing was timed")
    summary = summarize(src.records)
    pooled = summary[summary["suite"] == "all"].set_index("route")
    names = list(pooled.index)
    counts = count_layers(src.manifest["config"], names, new_tokens, src.manifest.get("checkpoints"))
    config = {"check": "what-was-timed", "source": str(src.path), "new_tokens": new_tokens,
              "source_config_hash": src.manifest["config_hash"]}  # fmt: skip
    kinds = {r.route: r.route_params.get("kind") for r in src.records}
    with RunDir(out, build_manifest(config), kind=KIND) as run:
        for name in names:
            row = pooled.loc[name]
            nan = {"prompt": "-", "verify_calls": 0, "layers_per_verify": math.nan, "layers_min": math.nan,
                   "model_layers": math.nan}  # fmt: skip
            c = counts.get(name)
            verdict = EXTERNAL if c is None else timing_verdict(c["layers_min"], c["model_layers"])
            run.append({
                "route": name, "kind": kinds[name],
                **(c or nan), "verdict": verdict,
                "device": src.manifest.get("device"), "MAL": float(row["MAL"]),
                "tokens_per_s": float(row["tokens_per_s"]), "step_ms": float(row["step_ms"]),
                **{f"{s}_ms": float(row[f"{s}_ms"]) for s in STAGES},
            })  # fmt: skip
        run.write_report()
        return run


def table(records: list[dict]) -> pd.DataFrame:
    cols = ["route", "kind", "model_layers", "layers_per_verify", "layers_min", "verify_calls", "MAL",
            "tokens_per_s", "step_ms", *(f"{s}_ms" for s in STAGES), "verdict"]  # fmt: skip
    return pd.DataFrame([{c: r[c] for c in cols} for r in records], columns=cols)


def build_report(run: Run, figures_dir: Path | None) -> str:
    from repro.reporting.report import markdown_table

    t = table(run.records)
    run.write("table.csv", t.to_csv(index=False))
    cfg = run.manifest["config"]
    bad = t[t["verdict"] != MODEL]["route"].tolist()
    verdict = (
        f"**{SINGLE}: {', '.join(bad)}** (fewer layers executed per verify than the model has)."
        if bad
        else "**Model timing: every route's verify executed every layer of the model.**"
    )
    first = run.records[0] if run.records else {}
    text = (
        f"# What was timed: {cfg['source']}\n\n{verdict}\n\n"
        f"Layers executed per verify step are counted (a hook on every decoder layer) while re-running"
        f" prompt {first.get('prompt')} for {cfg['new_tokens']} new tokens with each route on the CPU"
        " reference path; the stage breakdown (ms per verify step, draft + tree + verify + commit <= step)"
        f" is the source run's, as recorded on {first.get('device')}.\n\n"
        + markdown_table(
            t,
            {
                "layers_per_verify": "{:.1f}",
                "MAL": "{:.2f}",
                "tokens_per_s": "{:.1f}",
                **{c: "{:.3f}" for c in t.columns if c.endswith("_ms")},
            },
        )  # fmt: skip
        + "\n"
    )
    run.write("report.md", text)
    return text


KIND = RunKind(
    "falsify-what-was-timed",
    fields_parser("route", "model_layers", "layers_min", "verdict"),
    build_report,
    ("report.md", "table.csv"),
)
