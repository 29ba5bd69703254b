"""Data parallelism over prompts: the shards of a run and their merge into one run directory.

Prompt i of an experiment (its suites in order, each the seeded subsample) belongs to shard i % n with
all its turns and routes, so the per-prompt AR reference and MT-Bench's second turn stay on one shard.
Shard K of n is a normal run directory of the same kind and config at ``DIR/shards/rank-K`` whose
manifest says ``shard: "K/n"`` (and the host and device that decoded it); :func:`merge_shards` checks
every shard against the others and appends their records to ``DIR`` through :class:`RunDir`. Under
``torchrun`` (:func:`distributed_shard`) each rank decodes its shard and rank 0 merges after a barrier.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from repro.data.suites import Prompt, load_suite
from repro.errors import ReproError, RunDirError, not_a_folder
from repro.reporting.records import MANIFEST_FILE, RECORDS_FILE, foreign_record
from repro.reporting.rundir import (
    ACROSS_CODE_ENV,
    SHARD_NAME,
    SHARDS_DIR,
    Kinds,
    Run,
    RunDir,
    check_target,
    code_change,
    edited,
    load_run,
    read_manifest,
    recorded_device_class,
)

BARRIER_TIMEOUT = timedelta(hours=48)  # the slowest rank's decoding; the default (30 min) is too short
# manifest entries of one shard (or one session) that the merged run directory does not inherit
SHARD_ONLY = ("shard", "host", "rank_device", "resumes", "outputs", "created_at", "updated_at", "kind")
SHARD_ONLY += ("config_hash", "figures_dir", "shards")


@dataclass(frozen=True)
class Shard:
    """Shard ``rank`` of ``world``: the prompts i with i % world == rank."""

    rank: int
    world: int

    def __str__(self) -> str:
        return f"{self.rank}/{self.world}"


def parse_shard(text: str) -> Shard:
    """``"i/n"`` with 0 <= i < n, else a one-line ReproError."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not int(m[1]) < int(m[2]):
        raise ReproError(f"--shard must be i/n with 0 <= i < n (e.g. 0/4), got {text!r}")
    return Shard(int(m[1]), int(m[2]))


def env_shard(environ: Mapping[str, str] | None = None) -> Shard | None:
    """The shard of this process under torchrun (RANK / WORLD_SIZE set), else None."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    return Shard(int(env["RANK"]), int(env["WORLD_SIZE"]))


def shard_path(out: Path, rank: int) -> Path:
    return Path(out) / SHARDS_DIR / f"rank-{rank}"


def experiment_prompts(cfg: Mapping[str, Any]) -> list[Prompt]:
    """Every prompt of an experiment: its suites in order, each its seeded subsample."""
    out: list[Prompt] = []
    for suite in cfg["suites"]:
        out += load_suite(suite, limit=cfg["limit"], seed=int(cfg["seed"]))
    return out


def shard_prompts(prompts: list[Prompt], shard: Shard | None) -> list[Prompt]:
    """The prompts of ``shard`` (all of them without one)."""
    return prompts if shard is None else prompts[shard.rank :: shard.world]


def expected_keys(cfg: Mapping[str, Any], shard: Shard) -> set[tuple]:
    """The record keys (route, suite, prompt_id, turn) a complete shard holds."""
    return {
        (route["name"], p.suite, p.id, turn)
        for p in shard_prompts(experiment_prompts(cfg), shard)
        for turn in range(len(p.turns))
        for route in cfg["routes"]
    }


def shard_manifest(shard: Shard, device: str) -> dict[str, Any]:
    """The manifest entries of a shard: which shard, and the host and device that decode it."""
    return {"shard": str(shard), "host": socket.gethostname(), "rank_device": device}


def check_shards(out: Path, shard: Shard, new: Mapping[str, Any]) -> None:
    """Refuse (RunDirError), before anything is written, to decode ``shard`` of the run ``new`` (a full
    manifest: :func:`repro.reporting.rundir.new_manifest`) under ``out``: ``out`` must be empty, the
    merged run of that configuration or hold only its shards (:func:`check_target`), and every shard
    folder there must be a shard of the same split."""
    check_target(Path(out), new)
    root = Path(out) / SHARDS_DIR
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        rank = int(SHARD_NAME.fullmatch(folder.name)[1])  # check_target refused other names
        was = read_manifest(folder, writing=True).get("shard") if (folder / MANIFEST_FILE).exists() else None
        if rank >= shard.world or was not in (None, f"{rank}/{shard.world}"):
            raise RunDirError(
                f"{folder} holds shard {was or f'{rank}/?'} of a run, not a shard of a {shard.world}-way"
                " split; rerun with the same number of shards or use another --out (nothing was written)"
            )


# ------------------------------------------------------------------------------ torch.distributed


def init_distributed(shard: Shard, device: str) -> str:
    """Join the process group torchrun set up (gloo on CPU, nccl on CUDA with this rank on
    ``cuda:LOCAL_RANK``); returns this rank's device."""
    import torch
    import torch.distributed as dist

    if device.startswith("cuda"):
        local = int(os.environ.get("LOCAL_RANK", shard.rank))
        torch.cuda.set_device(local)  # "cuda" (the config's device) now means cuda:LOCAL_RANK
        dist.init_process_group("nccl", timeout=BARRIER_TIMEOUT, device_id=torch.device("cuda", local))
        return f"cuda:{local}"
    dist.init_process_group("gloo", timeout=BARRIER_TIMEOUT)
    return device


def barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def finish_distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------ merging


@dataclass
class Merged:
    """What a merge did: records appended and already present, the shards read, the ranks missing."""

    path: Path
    appended: int
    present: int
    shards: list[str]
    missing: list[int]
    markdown: str
    records: list[Any] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)


def _shard_runs(out: Path, kinds: Kinds) -> list[tuple[int, Run]]:
    if not Path(out).is_dir():
        raise ReproError(not_a_folder(out, "the run directory"))
    root = Path(out) / SHARDS_DIR
    dirs = sorted(root.glob("rank-*")) if root.is_dir() else []
    if not dirs:
        raise ReproError(f"{out} has no shards ({root}/rank-K); run `repro run ... --shard K/N --out {out}`")
    runs = []
    for d in dirs:
        m = SHARD_NAME.fullmatch(d.name)
        if not m:
            raise ReproError(f"{d} is not a shard directory (expected rank-K)")
        runs.append((int(m[1]), load_run(d, kinds)))
    return sorted(runs, key=lambda r: r[0])


def _check_shards(runs: list[tuple[int, Run]]) -> int:
    """Every shard of the same kind, config, seed and device class as the first, labelled as its folder
    says, of one split; returns the number of shards n."""
    first = runs[0][1].manifest
    worlds = set()
    for rank, run in runs:
        m, where = run.manifest, f"shard {run.path}"
        label = m.get("shard")
        try:
            shard = parse_shard(str(label))
        except ReproError:
            raise ReproError(f"{where} has no shard i/n in its manifest (shard: {label!r})") from None
        if shard.rank != rank:
            raise ReproError(f"{where} says it is shard {label}, not rank {rank}")
        worlds.add(shard.world)
        if why := edited(m):
            raise ReproError(f"{where} {why}; not merged")
        if run.kind.name != runs[0][1].kind.name:
            raise ReproError(
                f"{where} is a {run.kind.name} run, the others {runs[0][1].kind.name}; not merged"
            )
        if m["config_hash"] != first["config_hash"]:
            raise ReproError(
                f"{where} has another config hash ({m['config_hash'][:12]} != {first['config_hash'][:12]});"
                " shards of different configurations are not merged"
            )
        if m.get("seed") != first.get("seed"):
            raise ReproError(f"{where} has another seed ({m.get('seed')} != {first.get('seed')}); not merged")
        if code_change(first.get("git_sha"), m.get("git_sha")):
            raise ReproError(
                f"{where} was written by git sha {m.get('git_sha')}, shard {first.get('shard')} by"
                f" {first.get('git_sha')}; records of two code versions are not merged"
                f" ({ACROSS_CODE_ENV}=1 merges them)"
            )
        if recorded_device_class(m) != recorded_device_class(first):
            raise ReproError(
                f"{where} was measured on {recorded_device_class(m)}, the others on"
                f" {recorded_device_class(first)}; timings of two devices are not mixed"
            )
    if len(worlds) > 1:
        splits = ", ".join(f"/{n}" for n in sorted(worlds))
        raise ReproError(
            f"the shards of {runs[0][1].path.parent} come from different splits ({splits}); delete the"
            " shards of the split you do not want, then merge"
        )
    return worlds.pop()


def route_params(cfg: Mapping[str, Any], runs: list[tuple[int, Run]]) -> dict[str, dict[str, Any]]:
    """The resolved parameters of each route of ``cfg``: those of its first record in the shards (every
    other record of that route must have the same)."""
    names = {route["name"] for route in cfg["routes"]}
    params: dict[str, dict[str, Any]] = {}
    for _, run in runs:
        for record in run.records:
            if record.route in names:
                params.setdefault(record.route, record.route_params)
    return params


def merge_shards(out: str | Path, kinds: Kinds, partial: bool = False) -> Merged:
    """Append the records of every shard under ``out/shards/`` (runs of one of ``kinds``, e.g.
    :data:`repro.harness.run_kinds.KINDS`) to the run directory ``out`` (created or resumed through
    RunDir) and write its report. Refused, before anything is written, with one line:
    shards of another config hash, seed, kind or device class; a record found in two shards, in the
    wrong shard or differing from the one ``out`` already holds; missing shards or records unless
    ``partial``. Records already merged are skipped, so a merge can be repeated."""
    out = Path(out)
    runs = _shard_runs(out, kinds)
    world = _check_shards(runs)
    first = runs[0][1].manifest
    missing = sorted(set(range(world)) - {rank for rank, _ in runs})
    if missing and not partial:
        raise ReproError(
            f"{out} lacks shard(s) {', '.join(f'{r}/{world}' for r in missing)}; run them, or merge what"
            " is there with --partial"
        )
    owner: dict[tuple, int] = {}
    expected = {rank: expected_keys(first["config"], Shard(rank, world)) for rank, _ in runs}
    params = route_params(first["config"], runs)
    for rank, run in runs:
        for record in run.records:
            key = run.kind.key(record)
            if key in owner:
                raise ReproError(f"record {key} is in shards rank-{owner[key]} and rank-{rank}; not merged")
            if why := foreign_record(record, first["config"], expected[rank], params):
                raise ReproError(
                    f"record {key} of {run.path} does not belong to shard {rank}/{world} of this run ({why});"
                    " not merged"
                )
            owner[key] = rank
    for rank, run in runs:
        if len(run.records) < len(expected[rank]) and not partial:
            raise ReproError(
                f"{run.path} holds {len(run.records)} of its {len(expected[rank])} records (interrupted):"
                " rerun the same command to resume it, or merge what is there with --partial"
            )
    inherited = {k: v for k, v in first.items() if k not in SHARD_ONLY}
    provenance = {
        f"rank-{rank}": {
            "shard": run.manifest["shard"],
            "git_sha": run.manifest.get("git_sha"),
            "host": run.manifest.get("host"),
            "device": run.manifest.get("rank_device"),
            "device_description": run.manifest.get("device"),
            "records": len(run.records),
            "prompts": sorted({f"{r.suite}/{r.prompt_id}" for r in run.records}),
        }
        for rank, run in runs
    }
    kind = runs[0][1].kind
    shard_records = {kind.key(record): (run.path, record) for _, run in runs for record in run.records}

    def same_records(held: list[tuple[int, Any]]) -> None:
        """Refuse a record ``out`` already holds that differs from its shard's (before any write)."""
        for lineno, have in held:
            path, record = shard_records.get(kind.key(have), (None, have))
            if kind.dumps(have) != kind.dumps(record):
                raise ReproError(
                    f"{RECORDS_FILE} line {lineno}: record {kind.key(have)} differs from the one {path} holds"
                    " (the shard was decoded again after a merge); merge into a fresh directory"
                )

    with RunDir(out, inherited, kind, same_records) as run_dir:
        todo = [record for _, record in shard_records.values() if run_dir.get(*kind.key(record)) is None]
        for record in todo:
            run_dir.append(record)
        run_dir.update_manifest(shards={**run_dir.manifest.get("shards", {}), **provenance})
        markdown = run_dir.write_report()
        records = run_dir.records()
    return Merged(
        out,
        len(todo),
        len(owner) - len(todo),
        [str(run.manifest["shard"]) for _, run in runs],
        missing,
        markdown,
        records,
        first["config"],
    )
