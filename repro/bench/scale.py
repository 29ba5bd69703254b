"""`repro bench scale`: end-to-end tokens/s of the routes at the papers' model shapes, acceptance replayed.

No checkpoint of the papers is on these machines, but their costs are: the target is a HybridLM with
random bf16 weights at a named shape (:data:`repro.bench.model.MODEL_SHAPES`, built on the device as
``bench model`` builds it) behind the graphed engine (:class:`repro.models.graphed.GraphedTarget`: the
static decoder and its CUDA graphs), each route is built by :func:`repro.decoding.routes.build_route`
with random drafters of their real shapes (:mod:`repro.decoding.scale_routes`), and every prompt is
decoded by the ordinary engine (:func:`repro.decoding.engine.generate`). Only which draft tokens are accepted
is replayed (:mod:`repro.decoding.replayed`): the timing is the harness's own path at the real shape.

Drafter shapes (random weights, seeded): :mod:`repro.drafters.shapes`.

Random Gaussian logits over a 32k-248k vocabulary are nearly flat, so best-first trees of random
drafters are fans one level deep whose greedy spine cannot hold a replayed depth. ``logit_scale``
multiplies the target's random LM head (which the DFlash and EAGLE drafters share) so that drafter
marginals are peaked like a trained drafter's and trees grow a deep spine; the target's own logits
only pick the bonus token. Steps whose spine was shorter than the drawn depth are counted
(``truncated_steps``) and the MAL reported is the one realised.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import yaml

from repro.bench.kernels import baselines_dir
from repro.bench.model import MODEL_SHAPES, build_model, device_slug
from repro.decoding.engine import STAGES, Route, generate
from repro.decoding.replayed import AcceptanceProcess, ReplayedAcceptance, constant_p_for_mal
from repro.decoding.routes import prepare_graphs, resolve_spec
from repro.decoding.scale_routes import build_scale_route, replayed, route_drafters
from repro.decoding.switches import applied
from repro.errors import ConfigError, ReproError
from repro.gdn.backends import default_backend
from repro.models.graphed import GraphedTarget
from repro.models.hybrid import HybridLM
from repro.reporting import stats
from repro.reporting.report import accept_histogram, switches_text
from repro.reporting.rundir import Run, RunKind, fields_parser, load_run
from repro.reporting.stats import Paired, paired_ratio

SHAPES = ("qwen3.6-27b", "gdn-1.3b", "tiny")
DEFAULT_ROUTES = {
    "qwen3.6-27b": "ar,dflash_chain,ddtree,dflash_tfm",
    "gdn-1.3b": "ar,fla_sd,eagle_chain,specla",
    "tiny": "ar,dflash_chain,ddtree,dflash_tfm,fla_sd,eagle_chain,specla",
}
# the routes (scale names -> route specs): the papers' budgets (Weaver: 64 nodes, width 4 of 2..8)
ROUTE_SPECS: dict[str, dict[str, Any]] = {
    "ar": {"kind": "ar"},
    "dflash_chain": {"kind": "dflash_chain", "drafter": "random"},
    "ddtree": {"kind": "ddtree", "drafter": "random", "budget": 64},
    "dflash_tfm": {"kind": "dflash_tfm", "drafter": "random", "weaver": "random", "budget": 64, "width": 4},
    "fla_sd": {"kind": "fla_sd", "drafter": "random", "k": 6},  # SpecLA's baseline: stock fla kernels, replay
    "eagle_chain": {"kind": "eagle_chain", "drafter": "random", "k": 6},
    "specla": {"kind": "specla", "drafter": "random", "budget": 32},
}
ACCEPTANCE_SOURCES = ("paper-mal", "paper-mal:SUITE", "mal:X", "records:DIR")
# kinds that share one acceptance (aliases)
CANONICAL = {"weaver": "dflash_tfm", "eagle_tree": "specla"}
COLUMNS = [
    "shape", "route", "kind", "acceptance", "acceptance_model", "target_MAL", "MAL", "truncated",
    "tokens_per_s", "speedup", "ci_low", "ci_high", "paper_speedup", "paper_ref", "step_ms", "draft_ms",
    "tree_ms", "verify_ms", "commit_ms", "busy_ms", "wall_over_busy", "wait_ms", "nodes", "steps", "launched",
    "prompts", "new_tokens", "drafter",
]  # fmt: skip
BUSY_COLUMNS = ("busy_ms", "wall_over_busy")  # only where the records have graph busy times
WAIT_COLUMNS = ("wait_ms",)  # only where the records have the host's read waits (since 2026-12-05)
LAUNCH_COLUMNS = ("steps", "launched")  # only where the records count launched steps (since 2026-12-03)


def canonical(kind: str) -> str:
    return CANONICAL.get(kind, kind)


# ------------------------------------------------------------------------------ acceptance


@dataclass(frozen=True)
class AcceptanceSpec:
    """``paper-mal[:suite]``, ``mal:X`` or ``records:DIR`` (see :func:`parse_acceptance`)."""

    kind: str
    arg: str = ""

    @property
    def text(self) -> str:
        return f"{self.kind}:{self.arg}" if self.arg else self.kind


def parse_acceptance(text: str) -> AcceptanceSpec:
    """The acceptance source of a command line, or a one-line ConfigError."""
    kind, _, arg = text.strip().partition(":")
    if kind == "paper-mal":
        if arg and arg not in PAPER_SUITES:
            raise ConfigError(f"paper-mal suite {arg!r} unknown; known: {', '.join(PAPER_SUITES)}")
        return AcceptanceSpec(kind, arg)
    if kind == "mal":
        try:
            value = float(arg)
        except ValueError:
            raise ConfigError(f"--acceptance mal:X needs a number, got {text!r}") from None
        if not value >= 1.0:
            raise ConfigError(f"a MAL counts the bonus token and is >= 1, got {arg}")
        return AcceptanceSpec(kind, arg)
    if kind == "records" and arg:
        _decode_run(arg)  # refused now, not after a 27B model was built
        return AcceptanceSpec(kind, arg)
    raise ConfigError(f"unknown acceptance {text!r}; choose one of {', '.join(ACCEPTANCE_SOURCES)}")


PAPER_SUITES = ("gsm8k", "humaneval", "mt_bench")


def paper_mals(suite: str = "") -> dict[str, tuple[float, str]]:
    """Per canonical route kind: (MAL, how it follows from baselines/).

    The Weaver paper reports MAL gains, not MALs: DFlash-TfM +77% over chain DFlash and +32% over
    DDTree at budget 64 (weaver.yaml). Chain DFlash's MAL is the DFlash paper's acceptance length tau
    (Qwen3-8B, B200, greedy; related.yaml), the mean of its suites (or ``suite``'s); DFlash-TfM =
    chain x 1.77, DDTree = DFlash-TfM / 1.32. EAGLE routes take EAGLE-3's tau on the same table.
    """
    root = baselines_dir()
    weaver = yaml.safe_load((root / "weaver.yaml").read_text(encoding="utf-8"))
    related = yaml.safe_load((root / "related.yaml").read_text(encoding="utf-8"))
    gain = {m["metric"]: float(m["value"]) for m in weaver["end_to_end"]}
    rows = related["dflash_qwen3_8b_b200_greedy"]

    def tau(method: str) -> float:
        vals = [float(r["tau"]) for r in rows if r["method"] == method and (not suite or r["suite"] == suite)]
        return sum(vals) / len(vals)

    where = f"{suite}" if suite else "mean of gsm8k, humaneval, mt_bench"
    chain, eagle = tau("DFlash"), tau("EAGLE-3")
    tfm = chain * (1 + gain["mal_gain_vs_chain_dflash"])
    ddtree = tfm / (1 + gain["mal_gain_vs_ddtree"])
    ref = f"related.yaml dflash_qwen3_8b_b200_greedy ({where})"
    eagle_note = f"{eagle:.3f} = EAGLE-3 tau, {ref}"
    return {
        "dflash_chain": (chain, f"{chain:.3f} = DFlash tau, {ref}"),
        "dflash_tfm": (
            tfm,
            f"{tfm:.3f} = chain DFlash {chain:.3f} x (1 + {gain['mal_gain_vs_chain_dflash']}) "
            "(weaver.yaml mal_gain_vs_chain_dflash)",
        ),
        "ddtree": (
            ddtree,
            f"{ddtree:.3f} = DFlash-TfM {tfm:.3f} / (1 + {gain['mal_gain_vs_ddtree']}) (weaver.yaml)",
        ),
        "eagle_chain": (eagle, eagle_note),
        "specla": (eagle, eagle_note),
        "fla_sd": (eagle, eagle_note),
    }


def route_depth(route: Route) -> int:
    """Draft depth D of a route's trees: DFlash block - 1, EAGLE chain k, EAGLE tree depth, AR 0."""
    return depth_of(route.params)


def depth_of(params: dict[str, Any]) -> int:
    """:func:`route_depth` from resolved route parameters (a DFlash block not yet decided: random's 16)."""
    kind = canonical(params["kind"])
    if kind in ("dflash_chain", "ddtree", "dflash_tfm"):
        return int(params.get("block_size") or 16) - 1
    if kind in ("eagle_chain", "fla_sd"):
        return int(params["k"])
    if kind == "specla":
        return int(params["depth"])
    if kind == "ar":
        return 0
    raise ConfigError(f"route kind {params['kind']} has no draft depth known to bench scale")


def check_acceptance(spec: AcceptanceSpec, cfg: ScaleConfig) -> None:
    """Refuse (one line) a MAL that a route's draft depth cannot reach, or a records run without a route
    of some replayed kind, before anything is built."""
    if spec.kind == "records":
        run = _decode_run(spec.arg)
        for shape in cfg.shapes:
            for name in cfg.routes[shape]:
                params = resolve_spec({"name": name, **cfg.specs[name]})
                if depth_of(params):
                    records_route(run, spec.arg, canonical(params["kind"]))
        return
    if spec.kind not in ("mal", "paper-mal"):
        return
    mals = paper_mals(spec.arg) if spec.kind == "paper-mal" else {}
    for shape in cfg.shapes:
        for name in cfg.routes[shape]:
            params = resolve_spec({"name": name, **cfg.specs[name]})
            depth = depth_of(params)
            if depth:
                mal = float(spec.arg) if spec.kind == "mal" else mals[canonical(params["kind"])][0]
                try:
                    constant_p_for_mal(mal, depth)
                except ConfigError as exc:
                    raise ConfigError(f"route {name}: {exc}") from None


def _decode_run(path: str) -> Run:
    try:
        return load_run(path, require_records=True)
    except ReproError as exc:
        raise ConfigError(f"--acceptance records:{path}: {exc}") from None


# kinds whose drafts are the same (the EAGLE chain of k tokens): FLA-SD differs only in how the chain is
# verified and committed, so either's measured acceptance stands for the other's when it is missing
SAME_DRAFTS = {"eagle_chain": ("eagle_chain", "fla_sd"), "fla_sd": ("fla_sd", "eagle_chain")}


def records_route(run: Run, path: str, kind: str) -> str:
    """The route of ``run`` whose acceptance ``kind`` replays: the first of that kind, else of a kind with
    the same drafts (:data:`SAME_DRAFTS`); one line if there is none."""
    for want in SAME_DRAFTS.get(kind, (kind,)):
        names = [r.route for r in run.records if canonical(str(r.route_params.get("kind"))) == want]
        if names:
            return names[0]
    raise ConfigError(f"--acceptance records:{path} has no route of kind {kind}")


def records_probs(path: str, kind: str, depth: int) -> tuple[tuple[float, ...], str]:
    """Per-depth conditional acceptance (depths 1..``depth``) of the first route of ``kind`` in a decode
    run's records (:func:`records_route`), and a line saying which route and how many steps."""
    run = _decode_run(path)
    name = records_route(run, path, kind)
    hist = accept_histogram([r for r in run.records if r.route == name])
    cond = {int(d): float(p) for d, p in zip(hist["length"], hist["cond_accept_rate"]) if not math.isnan(p)}
    steps = sum(len(r.accepted_lengths) for r in run.records if r.route == name)
    probs = tuple(cond.get(d, 0.0) for d in range(1, depth + 1))
    return probs, f"route {name!r} of {path}: {steps} steps; depths beyond its records: p = 0"


def acceptance_for(spec: AcceptanceSpec, route: Route) -> AcceptanceProcess | None:
    """The acceptance process replayed on ``route`` (None for AR)."""
    kind, depth = canonical(route.params["kind"]), route_depth(route)
    if depth == 0:
        return None
    if spec.kind == "mal":
        return AcceptanceProcess.for_mal(float(spec.arg), depth, spec.text)
    if spec.kind == "paper-mal":
        mals = paper_mals(spec.arg)
        if kind not in mals:
            raise ConfigError(f"no paper MAL for route kind {kind}")
        mal, how = mals[kind]
        return AcceptanceProcess.for_mal(mal, depth, f"{spec.text} ({how})")
    probs, how = records_probs(spec.arg, kind, depth)
    return AcceptanceProcess(spec.text, probs, f"measured conditional acceptance per depth, {how}")


# ------------------------------------------------------------------------------ the run


@dataclass
class ScaleConfig:
    """What to run: shapes, routes per shape, acceptance source, prompts, tokens, dtype, seeds."""

    shapes: list[str]
    routes: dict[str, list[str]]
    acceptance: str = "paper-mal"
    prompts: int = 2
    prompt_len: int = 256
    max_new_tokens: int = 96
    warmup_tokens: int = 16
    logit_scale: float = 20.0
    dtype: str = "bf16"
    seed: int = 0
    commit: str = "closed_form"
    specs: dict[str, dict[str, Any]] = field(default_factory=lambda: dict(ROUTE_SPECS))
    switches: dict[str, bool | int] = field(default_factory=dict)  # engine switches (repro.decoding.switches)

    def as_dict(self) -> dict[str, Any]:
        """The run's config (its engine switches only when set: a run at the defaults has the config of
        earlier runs)."""
        switched = {"switches": dict(self.switches)} if self.switches else {}
        return {
            "bench": "scale",
            "shapes": {s: MODEL_SHAPES[s]().to_dict() for s in self.shapes},
            "routes": {s: [{"name": r, **self.specs[r]} for r in self.routes[s]] for s in self.shapes},
            "acceptance": self.acceptance,
            "prompts": self.prompts,
            "prompt_len": self.prompt_len,
            "prompt_ids": "uniform random ids, torch.Generator(seed * 100003 + index), warm-up index -1",
            "acceptance_draws": "per prompt: step_rng(generation_seed(seed * 100003 + index, prompt ids),"
            " output position), the same for every route (paired)",
            "max_new_tokens": self.max_new_tokens,
            "warmup_tokens": self.warmup_tokens,
            "logit_scale": self.logit_scale,
            "dtype": self.dtype,
            "seed": self.seed,
            "commit": self.commit,
            "engine": "graphed (GraphedTarget: CUDA graphs on CUDA, the eager static decoder elsewhere)",
            "gdn_backend": "triton on CUDA, reference elsewhere",
            **switched,
        }


def drafter_text(info: dict[str, Any]) -> str:
    parts = []
    for name, c in info.items():
        shape = f"d={c['d_model']} K={c['pool']}" if name == "weaver" else f"{c['layers']}L h={c['hidden']}"
        parts.append(f"{name} {shape} ({c['params'] / 1e6:.1f}M)")
    return "; ".join(parts) or "-"


def check_routes(names: list[str]) -> None:
    unknown = [r for r in names if r not in ROUTE_SPECS]
    if unknown or not names:
        raise ConfigError(
            f"unknown route(s) {', '.join(unknown) or '(none)'}; known: {', '.join(ROUTE_SPECS)}"
        )


def acceptance_seed(seed: int, index: int) -> int:
    """The seed of prompt ``index``'s replayed acceptance draws: one stream per prompt, so that prompts are
    independent samples of the acceptance process, and the same stream for every route of that prompt (a
    paired comparison). Before 2026-12-03 every prompt replayed the same draws (the rule's seed alone)."""
    return seed * 100_003 + index


def prompt_ids(vocab: int, length: int, index: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed * 100_003 + index)
    return torch.randint(0, vocab, (length,), generator=gen).tolist()


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}


def build_target(shape: str, cfg: ScaleConfig, device: torch.device) -> HybridLM:
    """The random-weight target at ``shape`` on ``device`` (GDN layers on the device's fastest exact
    backend: the Triton kernels on CUDA, as ``bench model``'s decoder), its LM head scaled by
    ``logit_scale``."""
    model = build_model(MODEL_SHAPES[shape](), device, DTYPES[cfg.dtype], cfg.seed)
    model.set_gdn_backend(default_backend(device, model.dtype))
    with torch.no_grad():
        model.lm_head.weight.mul_(cfg.logit_scale)
    return model


def build_routes(
    shape: str, cfg: ScaleConfig, target: HybridLM | GraphedTarget, spec: AcceptanceSpec
) -> list[Route]:
    """The shape's routes with their random drafters and the replayed acceptance (AR keeps greedy);
    built on the graphed target, the drafters take their static paths (buffers, CUDA graphs)."""
    routes = []
    for name in cfg.routes[shape]:
        route = build_scale_route({"name": name, **cfg.specs[name]}, shape, target, cfg.seed, cfg.commit)
        process = acceptance_for(spec, route)
        routes.append(route if process is None else replayed(route, process, cfg.seed))
    return routes


def decode_record(
    shape: str, route: Route, prompt: int, ids: list[int], target: GraphedTarget, cfg: ScaleConfig
) -> dict[str, Any]:
    """One prompt decoded by the engine with ``route``: what the record holds."""
    rule = route.rule
    replayed = isinstance(rule, ReplayedAcceptance)
    if replayed:
        rule.reset()
        rule.seed = acceptance_seed(cfg.seed, prompt)  # read by the device twin at each generation's begin
    res = generate(target, ids, route, cfg.max_new_tokens)
    return {
        "shape": shape,
        "route": route.name,
        "kind": route.params["kind"],
        "prompt": prompt,
        "status": "ok",
        "prompt_tokens": len(ids),
        "new_tokens": len(res.output_ids),
        "steps": res.steps,
        "launched_steps": res.steps if res.launched_steps is None else res.launched_steps,
        "accepted_lengths": res.accepted_lengths,
        "tree_sizes": res.tree_sizes,
        "prefill_s": res.prefill_s,
        "decode_s": res.decode_s,
        "stage_s": res.stage_s,
        "device_stage_s": res.device_stage_s,
        "busy_stage_s": res.busy_stage_s,
        "graph_captures": res.graph_captures,
        "host_wait_s": res.host_wait_s,
        "truncated_steps": rule.truncated if replayed else 0,
        "acceptance": rule.process.as_dict() if replayed else None,
        "acceptance_seed": rule.seed if replayed else None,
        "route_params": route.params,
        "drafter": route_drafters(route),
    }


def measure_shape(
    shape: str, cfg: ScaleConfig, device: torch.device, spec: AcceptanceSpec, emit: Callable[[dict], None]
) -> dict[str, Any]:
    """Every (prompt, route) of one shape (:func:`decode_shape`); returns model info, on CUDA with the GPU
    memory the shape peaked at, what earlier shapes held and what it left once its objects were gone."""
    held = 0.0  # what earlier shapes left allocated (GiB)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        held = torch.cuda.memory_allocated(device) / 2**30
    info = decode_shape(shape, cfg, device, spec, emit)
    # the shape's objects (target, drafters, buffers, graphs) hold one another in cycles (closures over the
    # target among its graphed calls): collected here, once decode_shape's frame, the last holder from
    # outside, is gone. (Collected inside it, a loop variable still held the last route and, through it,
    # the target: 56.2 GiB stayed after the 27B shape, results/2026-12-06-h100-scale-memory.)
    gc.collect()
    if device.type == "cuda":  # what the shape needed: target, drafters, buffers, graphs and their pools
        info["peak_gpu_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        info["held_gpu_gib"] = held
        # what the shape left allocated once its objects are gone and cuBLAS's per-stream workspaces are let
        # go (none, unless something holds them): the report names it, the next shape's peak includes it
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.empty_cache()
        info["left_gpu_gib"] = max(0.0, torch.cuda.memory_allocated(device) / 2**30 - held)
    return info


def decode_shape(
    shape: str, cfg: ScaleConfig, device: torch.device, spec: AcceptanceSpec, emit: Callable[[dict], None]
) -> dict[str, Any]:
    """The shape's target, drafters and graphs built, then every (prompt, route) decoded, prompts outermost
    and routes interleaved; returns model info. Everything it builds goes with its frame."""
    t0 = time.monotonic()
    model = build_target(shape, cfg, device)
    target = GraphedTarget(model)
    routes = build_routes(shape, cfg, target, spec)
    prepare_graphs(target, routes)
    setup_s = time.monotonic() - t0
    vocab = model.config.vocab_size
    warm = prompt_ids(vocab, cfg.prompt_len, -1, cfg.seed)
    for route in routes:  # first uses (drafter buffers, lazily captured graphs) outside the timed decodes
        generate(target, warm, route, cfg.warmup_tokens)
    for i in range(cfg.prompts):
        ids = prompt_ids(vocab, cfg.prompt_len, i, cfg.seed)
        for route in routes:
            emit(decode_record(shape, route, i, ids, target, cfg))
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "setup_s": setup_s,
        "graphs_captured": target.captures,
        "gdn_kernel": target.kernel,
        "fused_decoder": target.decoder.fused,
        "drafters": {r.name: route_drafters(r) for r in routes},
    }


def default_out_dir(device: torch.device) -> Path:
    return Path("results") / f"{datetime.now(timezone.utc):%Y-%m-%d}-{device_slug(device)}-scale"


def run_scale(
    cfg: ScaleConfig,
    device: torch.device,
    out_dir: str | Path,
    progress: Callable[[dict], None] | None = None,
) -> pd.DataFrame:
    """Every shape; records as they come, the report after each shape (and when the run stops inside one:
    its prompts so far, :func:`cut_lines`). Returns the table."""
    from repro.reporting.records import build_manifest
    from repro.reporting.rundir import RunDir

    spec = parse_acceptance(cfg.acceptance)
    check_acceptance(spec, cfg)
    manifest = build_manifest(cfg.as_dict(), seed=cfg.seed)
    with RunDir(out_dir, manifest, kind=KIND) as run:
        bench_device = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        run.update_manifest(bench_device=bench_device, models={})
        if device.type == "cuda":
            run.update_manifest(gpu_memory_gib=torch.cuda.get_device_properties(device).total_memory / 2**30)

        def emit(record: dict[str, Any]) -> None:
            run.append(record)
            if progress:
                progress(record)

        try:
            for shape in cfg.shapes:
                with applied(cfg.switches):
                    info = measure_shape(shape, cfg, device, spec, emit)
                run.update_manifest(models={**run.manifest["models"], shape: info})
                run.write_report()
        except BaseException:  # interrupted or failed inside a shape: its prompts so far are reported too
            if run.records():
                run.write_report()
            raise
        return summary_table(run.records())


# ------------------------------------------------------------------------------ report


def paper_speedups() -> dict[tuple[str, str], tuple[float, str]]:
    """(shape, route) -> the paper's e2e speedup over AR and its reference, where one exists."""
    root = baselines_dir()
    weaver = yaml.safe_load((root / "weaver.yaml").read_text(encoding="utf-8"))
    specla = yaml.safe_load((root / "specla.yaml").read_text(encoding="utf-8"))
    out = {}
    for m in weaver["end_to_end"]:
        if m["metric"] == "speedup_vs_ar" and m["method"] == "DFlash-TfM":
            out[("qwen3.6-27b", "dflash_tfm")] = (float(m["value"]), f"weaver.yaml ({m['ref']}, B200)")
    for m in specla["end_to_end"]:
        if m["metric"] == "speedup_vs_ar" and m.get("suite") == "mixed":
            out[("gdn-1.3b", "specla")] = (float(m["value"]), f"specla.yaml (mixed, {m['ref']}, H100)")
    return out


def memory_lines(manifest: dict[str, Any]) -> list[str]:
    """The report's line on the GPU memory each shape's measurement peaked at (torch's allocations: the
    target, drafters, static buffers, graphs and their pools; what the shapes before it left allocated, and
    what it left itself once its objects were gone, named) beside the card's, with a blank line after it;
    none for runs that did not record it."""
    models = {s: m for s, m in (manifest.get("models") or {}).items() if "peak_gpu_gib" in m}
    if not models:
        return []

    def held(m: dict[str, Any]) -> str:
        gib = m.get("held_gpu_gib", 0.0)
        before = f" ({gib:.1f} of it left allocated by the shapes before)" if gib >= 0.05 else ""
        left = m.get("left_gpu_gib", 0.0)
        return before + (f", {left:.1f} GiB left allocated after it" if left >= 0.05 else "")

    each = ", ".join(f"{shape} {m['peak_gpu_gib']:.1f} GiB{held(m)}" for shape, m in models.items())
    total = manifest.get("gpu_memory_gib")
    card = f" of the card's {total:.1f} GiB" if total else ""
    return [f"Peak GPU memory allocated (target, drafters, buffers, graphs): {each}{card}.", ""]


def cut_lines(table: pd.DataFrame, manifest: dict[str, Any]) -> list[str]:
    """The report's lines on shapes the run stopped inside (records, but no model info in the manifest:
    interrupted, out of time or failed), with a blank line after them; none for a finished run."""
    done = set(manifest.get("models") or {})
    total = (manifest.get("config") or {}).get("prompts")
    lines = []
    for shape in dict.fromkeys(table["shape"]):
        if shape not in done:
            n = int(table.loc[table["shape"] == shape, "prompts"].max())
            lines.append(f"**Cut short:** {shape} stopped after {n} of {total} prompts; its rows hold those.")
    return [*lines, ""] if lines else []


def stage_seconds(record: dict[str, Any]) -> dict[str, float]:
    """A record's seconds per stage on the device (CUDA events at the stage marks), else its wall-clock
    ones. On the graphed engine's device path no mark synchronizes, so the wall-clock split is the host's
    (its one wait lands in the last stage) and only the events say where the device's time goes."""
    return record.get("device_stage_s") or record["stage_s"]


def busy_seconds(group: list[dict[str, Any]]) -> float:
    """The records' summed CUDA-graph replay seconds (``busy_stage_s``); NaN unless every record has them."""
    busy = [r.get("busy_stage_s") for r in group]
    return math.nan if any(b is None for b in busy) else sum(sum(b.values()) for b in busy)


def summary_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (shape, route): replayed and realised MAL, tokens/s, speedup over the same shape's AR,
    per-stage ms per step, the graphs' busy ms per step and wall / busy, the paper's speedup beside."""
    paper = paper_speedups()
    rows = []
    groups = _groups(records)
    for (shape, route), group in groups.items():
        steps = sum(r["steps"] for r in group)
        decode_s = sum(r["decode_s"] for r in group)
        new = sum(r["new_tokens"] for r in group)
        acc = group[0]["acceptance"]
        stage = {s: sum(stage_seconds(r)[s] for r in group) for s in STAGES}
        ms = partial(_per_step_ms, steps=steps)
        busy = busy_seconds(group)
        waits = [r.get("host_wait_s") for r in group]
        ref = paper.get((shape, canonical(group[0]["kind"])))
        rows.append(
            {
                "shape": shape,
                "route": route,
                "kind": group[0]["kind"],
                "acceptance": acc["source"] if acc else "none (AR)",
                "acceptance_model": acc["model"] if acc else "",
                "target_MAL": acc["mal"] if acc else 1.0,
                "MAL": sum(sum(r["accepted_lengths"]) for r in group) / steps if steps else math.nan,
                "truncated": sum(r["truncated_steps"] for r in group),
                "tokens_per_s": new / decode_s if decode_s > 0 else math.nan,
                "speedup": math.nan,
                "ci_low": math.nan,
                "ci_high": math.nan,
                "paper_speedup": ref[0] if ref else None,
                "paper_ref": ref[1] if ref else None,
                "step_ms": ms(decode_s),
                **{f"{s}_ms": ms(stage[s]) for s in STAGES},
                "busy_ms": ms(busy),
                "wall_over_busy": decode_s / busy if busy > 0 else math.nan,
                "wait_ms": math.nan if None in waits else ms(sum(waits)),
                "nodes": sum(sum(r["tree_sizes"]) for r in group) / steps if steps else math.nan,
                "steps": steps,
                "launched": sum(r.get("launched_steps", r["steps"]) for r in group),
                "prompts": len(group),
                "new_tokens": new,
                "drafter": drafter_text(group[0]["drafter"]),
            }
        )
    table = pd.DataFrame(rows, columns=COLUMNS)
    if not table["busy_ms"].notna().any():  # records from before graph busy times: the table they had
        table = table.drop(columns=list(BUSY_COLUMNS))
    if not any("launched_steps" in r for r in records):  # records from before the count: the same
        table = table.drop(columns=list(LAUNCH_COLUMNS))
    if all(r.get("host_wait_s") is None for r in records):  # and before the host's read waits
        table = table.drop(columns=list(WAIT_COLUMNS))
    for shape in table["shape"].unique():
        mine = table["shape"] == shape
        ar = table[mine & (table["kind"] == "ar")]
        if not len(ar):
            continue
        table.loc[mine, "speedup"] = table.loc[mine, "tokens_per_s"] / float(ar["tokens_per_s"].iloc[0])
        reference = {r.get("prompt"): r for r in groups[(shape, ar["route"].iloc[0])]}
        if None in reference:  # records without their prompt's index: nothing to pair
            continue
        for i in table.index[mine & (table["kind"] != "ar")]:
            route = table.at[i, "route"]
            paired = paired_speedup(groups[(shape, route)], reference)
            table.loc[i, ["speedup", "ci_low", "ci_high"]] = [paired.value, paired.low, paired.high]
            if paired.n != table.at[i, "prompts"] or paired.n != len(reference):
                fewer = table.attrs.setdefault("paired", {})  # not a column: table.csv keeps its columns
                fewer[(shape, route)] = (paired.n, int(table.at[i, "prompts"]), len(reference))
    return table


def pairing_lines(table: pd.DataFrame) -> list[str]:
    """Report lines on the rows whose speedup pairs fewer prompts than the route or AR decoded (a failed or
    missing prompt on one side): the speedup and its interval are over the prompts both decoded."""
    return [
        f"- {shape} {route}: speedup over the {n} prompts both it and AR decoded (AR: {n_ar}, {route}:"
        f" {n_route}; the n column counts the route's)"
        for (shape, route), (n, n_route, n_ar) in table.attrs.get("paired", {}).items()
    ]


def paired_speedup(route: list[dict[str, Any]], reference: dict[int, dict[str, Any]]) -> Paired:
    """A route's speedup over the shape's AR paired per prompt (each prompt its own acceptance draws), with
    its percentile-bootstrap 95% CI (:func:`repro.reporting.stats.paired_ratio`)."""
    pairs = [(r, reference[r["prompt"]]) for r in route if r.get("prompt") in reference]
    return paired_ratio(
        (
            [r["new_tokens"] for r, _ in pairs],
            [r["decode_s"] for r, _ in pairs],
            [a["new_tokens"] for _, a in pairs],
            [a["decode_s"] for _, a in pairs],
        )
    )


def _per_step_ms(seconds: float, steps: int) -> float:
    return 1e3 * seconds / steps if steps else math.nan


def _groups(records: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        if r.get("status") == "ok":
            out.setdefault((r["shape"], r["route"]), []).append(r)
    return out


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(int(value) if spec == "d" else value, spec)


STAGE_SPLIT_TOLERANCE = 0.10  # stage times summing this close to the wall step are its breakdown


def breakdown_lines(table: pd.DataFrame) -> list[str]:
    """Per route with a paper speedup: what the paper's number needs of a step at the replayed MAL, beside
    what the step cost here (speedup = MAL x AR ms per token / step ms)."""
    lines = []
    for _, r in table[table["paper_speedup"].notna()].iterrows():
        ar = table[(table["shape"] == r["shape"]) & (table["kind"] == "ar")]
        if not len(ar) or not r["step_ms"] > 0:
            continue
        ar_ms, paper = float(ar["step_ms"].iloc[0]), float(r["paper_speedup"])
        need = r["MAL"] * ar_ms / paper
        stages = sum(float(r[f"{s}_ms"]) for s in STAGES)
        split = (
            f"draft {r['draft_ms']:.1f} + tree {r['tree_ms']:.1f} + verify {r['verify_ms']:.1f} "
            f"+ accept and commit {r['commit_ms']:.1f}"
        )
        if abs(stages - r["step_ms"]) <= STAGE_SPLIT_TOLERANCE * r["step_ms"]:
            split = f"= {split}"
        else:  # the events do not account for the step: their split is no breakdown of it
            split = f"(its stages' device times sum to {stages:.1f} ms, so {split} is not the step's split)"
        ahead = ""
        if "launched" in r and r["launched"] > r["steps"]:  # the pipelined loop's look-ahead past the end
            ahead = (
                f" Of its {int(r['launched'])} launched steps {int(r['launched'] - r['steps'])} ran past a "
                f"generation's end (in the time above): a launched step takes "
                f"{r['step_ms'] * r['steps'] / r['launched']:.1f} ms."
            )
        lines.append(
            f"- {r['shape']} {r['route']}: at MAL {r['MAL']:.2f} the paper's {paper:.2f}x needs a step of "
            f"{need:.1f} ms (MAL x AR {ar_ms:.2f} ms / {paper:.2f}); here a step takes {r['step_ms']:.1f} ms "
            f"{split} ({r['step_ms'] / ar_ms:.2f} AR steps), so {r['speedup']:.2f}x.{ahead}"
        )
    return lines


REPORT_COLUMNS = {  # column -> (header, format)
    "shape": ("shape", "s"), "route": ("route", "s"), "acceptance": ("acceptance replayed", "s"),
    "target_MAL": ("MAL (target)", ".2f"), "MAL": ("MAL", ".2f"), "truncated": ("trunc.", "d"),
    "tokens_per_s": ("tok/s", ".1f"), "speedup": ("speedup", ".2f"), "ci_low": ("95% CI low", ".2f"),
    "ci_high": ("95% CI high", ".2f"), "prompts": ("n", "d"), "paper_speedup": ("paper", ".2f"),
    "step_ms": ("step ms", ".2f"), "draft_ms": ("draft", ".2f"), "tree_ms": ("tree", ".2f"),
    "verify_ms": ("verify", ".2f"), "commit_ms": ("commit", ".2f"), "busy_ms": ("graphs busy", ".2f"),
    "wall_over_busy": ("wall/busy", ".2f"), "wait_ms": ("host wait", ".3f"), "nodes": ("nodes", ".1f"),
    "steps": ("steps", "d"),
    "launched": ("launched", "d"), "drafter": ("drafter", "s"),
}  # fmt: skip


def capture_lines(records: list[dict[str, Any]]) -> list[str]:
    """Report lines on the (shape, route) rows whose timed decodes captured CUDA graphs (none: none)."""
    lines = []
    for (shape, route), group in _groups(records).items():
        hit = [r for r in group if r.get("graph_captures")]
        if hit:
            n = sum(r["graph_captures"] for r in hit)
            lines.append(f"- {shape} {route}: {n} capture(s) in {len(hit)} of {len(group)} prompt(s)")
    if not lines:
        return []
    return ["", "## Graphs captured inside the timed decode", "", *lines, "",
            "Their warm-ups and capture are in those prompts' decode time (tok/s too low, wall/busy too "
            "high)."]  # fmt: skip


def report_markdown(
    table: pd.DataFrame, manifest: dict[str, Any], captures: Sequence[str] = (), figure: str | None = None
) -> str:
    """The run's report; ``captures``: :func:`capture_lines` of its records; ``figure``: the file name of
    its figure (:func:`repro.reporting.scale_figure.plot_scale`, beside report.md), linked under the table."""
    cfg = manifest.get("config", {})
    busy = "busy_ms" in table  # summary_table leaves them out for records from before graph busy times
    launched = "launched" in table  # and the step counts for records from before launched steps
    waits = busy and "wait_ms" in table  # the host's read waits beside the graphs' time (none before them)
    columns = {
        c: v for c, v in REPORT_COLUMNS.items()
        if (busy or c not in BUSY_COLUMNS) and (launched or c not in LAUNCH_COLUMNS)
        and (waits or c not in WAIT_COLUMNS)
    }  # fmt: skip
    head = [
        "# Scale rows: e2e tokens/s at the papers' shapes, acceptance replayed",
        "",
        f"Device: {manifest.get('bench_device', '?')}; dtype {cfg.get('dtype')}; {cfg.get('prompts')} "
        f"prompts of {cfg.get('prompt_len')} random tokens, {cfg.get('max_new_tokens')} new tokens each; "
        f"logit scale {cfg.get('logit_scale')}; acceptance `{cfg.get('acceptance')}`"
        + (f"; engine switches set: {switches_text(cfg['switches'])}." if cfg.get("switches") else "."),
        "",
        "Random weights at the real shapes on the graphed engine: the costs are real, the acceptance is "
        "replayed (only which draft tokens are accepted; docs/gpu.md, Replayed acceptance). These are not "
        "real-checkpoint numbers.",
        "",
        *memory_lines(manifest),
        *cut_lines(table, manifest),
        "| " + " | ".join(h for h, _ in columns.values()) + " |",
        "|" + "---|" * len(columns),
    ]
    shown = table.assign(acceptance=[a.split(" (")[0] for a in table["acceptance"]])
    rows = [
        "| " + " | ".join(_fmt(r[c], f) for c, (_, f) in columns.items()) + " |" for _, r in shown.iterrows()
    ]
    sources = [
        f"- {r['shape']} {r['route']}: {r['acceptance']}; {r['acceptance_model']}"
        for _, r in table.iterrows()
        if r["kind"] != "ar"
    ]
    refs = sorted(set(table["paper_ref"].dropna()))
    tail = ["", "speedup: the route's pooled tok/s over the same shape's AR on the prompts both decoded; its "
            "95% CI: percentile bootstrap over them, paired per prompt (each prompt its own acceptance "
            "draws, the same for every route; no interval below "
            f"{stats.MIN_UNITS} prompts). Per-stage columns are device ms "
            "per verify step (CUDA events at the stage marks; wall clock for records without them; verify "
            "includes the acceptance)."]  # fmt: skip
    if busy:
        tail[-1] += (" graphs busy: the CUDA graph replays' own ms per step; wall/busy: how much longer a "
                     "step takes than its graphs run.")  # fmt: skip
    if waits:
        tail[-1] += (" host wait: the host's ms per step waiting for a result not on the host yet (the "
                     "host ahead of the device; near zero, the host paces the loop).")  # fmt: skip
    if launched:
        tail[-1] += (
            " steps: verify steps recorded (the ms columns are per recorded step); launched: the steps run,"
            " the pipelined loop's step past the end of each generation included, whose time is in tok/s"
            " and the ms columns (a launched step's ms: step ms x steps / launched). tok/s counts the new"
            " tokens over the decode (prefill excluded)."
        )
    if refs:
        tail += ["Paper speedups: " + "; ".join(refs) + "."]
    if pairing := pairing_lines(table):
        tail += ["", *pairing]
    if figure:
        tail += ["", f"![speedup over AR and ms per step by stage]({figure})", "", FIGURE_CAPTION]
    if sources:
        tail += ["", "## Acceptance replayed (source, per route)", "", *sources]
    lines = breakdown_lines(table)
    if lines:
        tail += ["", "## Cost breakdown against the paper", "", *lines]
    tail += list(captures)
    return "\n".join(head + rows + tail) + "\n"


FIGURE_CAPTION = (
    "Per shape, left: speedup over AR (bars) beside the realised MAL (circles: the speedup if a step cost one"
    " AR step), the replayed target MAL where it differs (x) and the paper's speedup (diamonds); right: ms"
    " per verify step by stage (stacked, as the table's columns), the wall step (black tick, labelled in AR"
    " steps) and the step the paper's speedup needs at this MAL (red tick: MAL x AR ms / paper), AR's ms"
    " per token dotted. speedup ~ MAL / (step in AR steps)."
)


def build_report(run: Run, figures_dir: Path | None) -> str:
    """table.csv, the figure (:data:`FIGURE`, beside report.md, as a decode run's accept_histogram.png;
    unless ``figures_dir`` is None) and report.md of a bench-scale run, from its records."""
    from repro.reporting.scale_figure import FIGURE, plot_scale

    records = list(run.records)
    table = summary_table(records)
    run.write("table.csv", table.to_csv(index=False))
    figure = None
    if figures_dir is not None and not table.empty:
        acceptance = run.manifest.get("config", {}).get("acceptance")
        title = f"bench scale on {run.manifest.get('bench_device', '?')}, acceptance replayed: {acceptance}"
        plot_scale(table, run.path / FIGURE, title)
        run.written.append(FIGURE)
        figure = FIGURE
    text = report_markdown(table, run.manifest, capture_lines(records), figure)
    run.write("report.md", text)
    return text


KIND = RunKind(
    "bench-scale",
    fields_parser("shape", "route", "kind", "prompt", "status"),
    build_report,
    ("report.md", "table.csv", "speedup_stages.png"),  # the figure: repro.reporting.scale_figure.FIGURE
    key=lambda r: (r["shape"], r["route"], r["prompt"]),
)
