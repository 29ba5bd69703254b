"""Decode records and the environment part of run manifests.

A decode run's ``records.jsonl`` holds one :class:`DecodeRecord` per (route, suite, prompt_id,
turn); the run directory itself (writing, resuming, reading back) is :mod:`repro.reporting.rundir`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from repro import __version__

MANIFEST_FILE = "manifest.json"
RECORDS_FILE = "records.jsonl"
ARCHIVED_RECORDS_FILE = "records.jsonl.xz"  # a finished run's records, compressed (repro archive)
STAGES = ("draft", "tree", "verify", "commit")
FINISH_REASONS = ("stop", "length")
VS_AR_FIXED = ("reference", "identical", "no reference")
EXTERNAL_VS_AR = ("refused: ", "sampled: ")  # an external loop's refusal, or its sampling (not compared)
_DIVERGED = re.compile(r"^diverged at token (\d+)$")

RecordKey = tuple[str, str, str, int]


class RecordsWarning(UserWarning):
    """A recoverable problem in a records file (e.g. a truncated last line)."""


def sha256_ids(ids: list[int]) -> str:
    """sha256 hex digest of the token ids written as ``",".join(str(i))`` (prompts and outputs)."""
    return hashlib.sha256(",".join(str(int(i)) for i in ids).encode("ascii")).hexdigest()


def compare_to_reference(ids: list[int], ref_ids: list[int]) -> str:
    """``"identical"`` or ``"diverged at token k"``, k = first differing 0-based generated index.

    When one sequence is a prefix of the other, k is the shorter length.
    """
    ids, ref_ids = list(ids), list(ref_ids)
    if ids == ref_ids:
        return "identical"
    for k, (a, b) in enumerate(zip(ids, ref_ids, strict=False)):
        if a != b:
            return f"diverged at token {k}"
    return f"diverged at token {min(len(ids), len(ref_ids))}"


def divergence_index(vs_ar: str) -> int | None:
    """The k of a ``"diverged at token k"`` string, else None."""
    m = _DIVERGED.match(vs_ar)
    return int(m.group(1)) if m else None


def is_ar_route(route_params: dict[str, Any]) -> bool:
    """An AR route is one whose ``route_params["kind"] == "ar"`` (its name does not matter)."""
    return route_params.get("kind") == "ar"


def is_external_route(route_params: dict[str, Any]) -> bool:
    """A route of kind ``external`` runs another implementation's loop (``repro.engines``): its record
    may lack per-step counts (``steps`` 0: the loop reports none) and its ``vs_ar`` may be a refusal."""
    return route_params.get("kind") == "external"


def reference_route(routes: Iterable[tuple[str, dict[str, Any]]]) -> str | None:
    """The AR baseline of a run: the first route (in run order) whose kind is ``ar``; None without one.

    ``routes`` are (name, route_params) pairs. The runner and the report both use this definition.
    """
    return next((name for name, params in routes if is_ar_route(params)), None)


def foreign_record(
    record: DecodeRecord, cfg: Mapping[str, Any], keys: set[tuple], params: Mapping[str, dict[str, Any]]
) -> str | None:
    """Why ``record`` cannot have been written by the run of the resolved config ``cfg`` whose records
    have the ``keys`` (route, suite, prompt_id, turn) and whose routes resolve to ``params`` (route name
    -> route_params), or None: the one check of a record against a configuration (resume and merge)."""
    if record.route not in params:
        return f"route {record.route!r} is not in this run's config"
    if record.route_params != params[record.route]:
        return (
            f"route {record.route!r} has route_params {record.route_params} but this run builds"
            f" {params[record.route]}"
        )
    if record.key not in keys:
        return f"{record.suite}/{record.prompt_id} turn {record.turn} is not one of this run's prompts"
    if record.seed != int(cfg["seed"]):
        return f"seed {record.seed} is not this run's {cfg['seed']}"
    if record.temperature != float(cfg["temperature"]):
        return f"temperature {record.temperature} is not this run's {cfg['temperature']}"
    if record.new_tokens > int(cfg["max_new_tokens"]):
        return f"new_tokens {record.new_tokens} exceeds this run's max_new_tokens {cfg['max_new_tokens']}"
    return None


# the JSON type of each DecodeRecord field (bool is not accepted where a number is)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(
        ("route", "suite", "prompt_id", "prompt_sha256", "output_sha256", "finish_reason", "vs_ar"), (str,)
    ),
    **dict.fromkeys(("turn", "prompt_tokens", "new_tokens", "steps", "seed"), (int,)),
    **dict.fromkeys(("prefill_s", "decode_s", "temperature"), (int, float)),
    **dict.fromkeys(("accepted_lengths", "tree_sizes", "output_ids"), (list,)),
    **dict.fromkeys(("route_params", "stage_s"), (dict,)),
    **dict.fromkeys(("device_stage_s", "busy_stage_s"), (dict, type(None))),
    "graph_captures": (int, type(None)),
    "launched_steps": (int, type(None)),
    "host_wait_s": (int, float, type(None)),
}


@dataclass
class DecodeRecord:
    """Result of decoding one turn of one prompt with one route (one line of records.jsonl).

    ``accepted_lengths[i]`` counts the tokens committed by verify step i including the bonus
    token (AR: 1 per step). The first new token comes from prefill's logits, so
    ``sum(accepted_lengths) == new_tokens - 1`` (0 when nothing was generated).
    """

    route: str
    route_params: dict[str, Any]
    suite: str
    prompt_id: str
    turn: int
    prompt_sha256: str
    prompt_tokens: int
    new_tokens: int
    steps: int
    accepted_lengths: list[int]
    tree_sizes: list[int]
    prefill_s: float
    decode_s: float
    stage_s: dict[str, float]
    output_ids: list[int]
    output_sha256: str
    finish_reason: str
    vs_ar: str
    temperature: float
    seed: int
    device_stage_s: dict[str, float] | None = None  # device (CUDA event) time per stage; old records: None
    busy_stage_s: dict[str, float] | None = None  # CUDA-graph replay time per stage; None: no graphs / old
    graph_captures: int | None = None  # CUDA graphs captured inside the timed decode; None: old records
    # steps the decode ran when more than ``steps`` (a pipelined loop's step past the end, AR's groups
    # launched ahead of a stop): their time is in decode_s; None: as many as ``steps``, or old records
    launched_steps: int | None = None
    # seconds of decode_s the host waited for step results still on their way (the host ahead of the device);
    # None: off the graphed engine, or old records
    host_wait_s: float | None = None

    @property
    def key(self) -> RecordKey:
        """(route, suite, prompt_id, turn): the identity of a record within a run."""
        return (self.route, self.suite, self.prompt_id, self.turn)

    @property
    def is_ar(self) -> bool:
        return is_ar_route(self.route_params)

    @property
    def tokens_per_s(self) -> float:
        """new_tokens / decode_s (prefill excluded); NaN when decode_s is not positive."""
        return self.new_tokens / self.decode_s if self.decode_s > 0 else math.nan

    @property
    def mean_accepted_length(self) -> float:
        """sum(accepted_lengths) / steps; NaN when there was no verify step."""
        return sum(self.accepted_lengths) / self.steps if self.steps > 0 else math.nan

    def validate(self) -> None:
        """Raise ValueError when a field has the wrong JSON type or the record is internally inconsistent."""
        for name, types in _FIELD_TYPES.items():
            value = getattr(self, name)
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                raise ValueError(f"{name} must be {' or '.join(t.__name__ for t in types)}, got {value!r}")
        if not isinstance(self.turn, int) or self.turn < 0:
            raise ValueError(f"turn must be a non-negative int, got {self.turn!r}")
        if self.new_tokens != len(self.output_ids):
            raise ValueError(f"new_tokens={self.new_tokens} but {len(self.output_ids)} output_ids")
        if self.steps != len(self.accepted_lengths):
            raise ValueError(f"steps={self.steps} but {len(self.accepted_lengths)} accepted_lengths")
        external = is_external_route(self.route_params)
        if self.steps != len(self.tree_sizes) and not (external and not self.tree_sizes):
            raise ValueError(f"steps={self.steps} but {len(self.tree_sizes)} tree_sizes")
        if self.launched_steps is not None and self.launched_steps < self.steps:
            raise ValueError(f"launched_steps={self.launched_steps} < steps={self.steps}")
        if any(a < 1 for a in self.accepted_lengths):
            raise ValueError("accepted lengths include the bonus token and must be >= 1")
        if sum(self.accepted_lengths) != max(self.new_tokens - 1, 0) and not (external and not self.steps):
            raise ValueError(
                f"sum(accepted_lengths)={sum(self.accepted_lengths)} but new_tokens - 1 ="
                f" {self.new_tokens - 1} (the first new token comes from prefill)"
            )
        missing = [s for s in STAGES if s not in self.stage_s]
        if missing:
            raise ValueError(f"stage_s lacks {', '.join(missing)}")
        for name in ("device_stage_s", "busy_stage_s"):
            times = getattr(self, name)
            lacking = [s for s in STAGES if times is not None and s not in times]
            if lacking:
                raise ValueError(f"{name} lacks {', '.join(lacking)}")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        if (
            self.vs_ar not in VS_AR_FIXED
            and not _DIVERGED.match(self.vs_ar)
            and not (external and self.vs_ar.startswith(EXTERNAL_VS_AR))
        ):
            raise ValueError(f"vs_ar {self.vs_ar!r} is not one of {VS_AR_FIXED} or 'diverged at token k'")
        if self.output_sha256 != sha256_ids(self.output_ids):
            raise ValueError("output_sha256 does not match sha256_ids(output_ids)")
        if self.decode_s < 0 or self.prefill_s < 0 or (self.host_wait_s or 0) < 0:
            raise ValueError("negative time")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        """One compact JSON line (no trailing newline)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DecodeRecord:
        """Build and validate; unknown keys are ignored, missing keys raise ValueError (but for the
        optional fields that later versions added, e.g. ``device_stage_s``, ``busy_stage_s``)."""
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, got {type(d).__name__}")
        names = [f.name for f in fields(cls)]
        optional = {f.name for f in fields(cls) if f.default is not MISSING}
        missing = [n for n in names if n not in d and n not in optional]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        rec = cls(**{n: d[n] for n in names if n in d})
        rec.validate()
        return rec

    @classmethod
    def from_json(cls, line: str) -> DecodeRecord:
        return cls.from_dict(json.loads(line))


# ----------------------------------------------------------------------------------- manifest


def canonical_json(obj: Any) -> str:
    """Key-sorted, whitespace-free JSON; non-JSON values (paths, ...) are written with str()."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the full resolved config."""
    return hashlib.sha256(canonical_json(config).encode("utf-8")).hexdigest()


def code_versions(manifest: Mapping[str, Any]) -> str:
    """The git sha a run began with, and those of later sessions that resumed it with other code, and of
    merged shards (``shards``: a merge's provenance) that other code wrote."""
    first = str(manifest.get("git_sha", "unknown"))
    later = [str(r.get("git_sha")) for r in manifest.get("resumes", []) if isinstance(r, dict)]
    others = [sha for i, sha in enumerate(later) if sha != first and sha not in later[:i]]
    shards = manifest.get("shards")
    merged = [
        str(s["git_sha"]) for s in (shards.values() if isinstance(shards, dict) else [])
        if isinstance(s, dict) and s.get("git_sha") is not None
    ]  # fmt: skip
    by = [sha for i, sha in enumerate(merged) if sha not in (first, *others) and sha not in merged[:i]]
    return (
        first
        + (f" (resumed with {', '.join(others)})" if others else "")
        + (f" (shards also by {', '.join(by)})" if by else "")
    )


def git_sha(root: Path | None = None) -> str:
    """``git rev-parse HEAD`` of the checkout the package runs from, else "unknown"; with tracked files
    modified, ``"<sha>-dirty-<diff>"``, ``<diff>`` the short sha256 of ``git diff HEAD`` (two different
    uncommitted edits are two code versions). Untracked files (a run's own output) do not count.

    A copy without ``.git`` (the GPU machine gets the working tree only) reports the sha that the
    sender put in ``REPRO_GIT_SHA``.
    """
    if os.environ.get("REPRO_GIT_SHA"):
        return os.environ["REPRO_GIT_SHA"]
    root = (root or Path(__file__).resolve().parents[2]).resolve()

    def git(*args: str) -> bytes:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=20, check=True)
        return out.stdout

    try:
        top = Path(git("rev-parse", "--show-toplevel").decode().strip()).resolve()
        if top != root:  # e.g. an installed copy that happens to sit inside another repository
            return "unknown"
        sha = git("rev-parse", "HEAD").decode().strip()
        diff = git("diff", "HEAD", "--binary", "--no-ext-diff", "--no-color")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}-dirty-{hashlib.sha256(diff).hexdigest()[:12]}" if diff else sha


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_info() -> dict[str, Any]:
    """CPU model, CUDA device name(s) when available, torch thread count, and a one-line description."""
    info: dict[str, Any] = {"cpu": _cpu_model(), "cuda": None, "torch_threads": None}
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            info["cuda"] = torch.cuda.get_device_name(0) + (f" x{n}" if n > 1 else "")
    except ImportError:
        pass
    desc = info["cuda"] or info["cpu"]
    if info["torch_threads"] is not None:
        desc += f", torch threads {info['torch_threads']}"
    info["description"] = desc
    return info


def device_class(info: dict[str, Any], config: dict[str, Any] | None = None) -> str:
    """The class of device a run's timings belong to: the GPU model (``"NVIDIA H200"``, without the
    count) when the run decodes on CUDA (or the machine has one and the config names no device), else
    ``"cpu"``."""
    on_cpu = str((config or {}).get("device", "")).startswith("cpu")
    cuda = info.get("cuda")
    if on_cpu or not cuda:
        return "cpu"
    return re.sub(r" x\d+$", "", str(cuda))


def package_versions() -> dict[str, str]:
    """Versions of python and of those of torch / transformers / numpy / pandas and the kernel libraries
    (triton, fla) that are installed."""
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "numpy", "pandas", "triton", "fla-core", "flash-linear-attention"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def repro_env() -> dict[str, str]:
    """The REPRO_* environment variables set for this process (kernel switches such as REPRO_PDL and
    REPRO_VERIFY_ROWS change what a run times; REPRO_GIT_SHA names the code)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("REPRO_")}


# REPRO_* variables that name code, paths or the harness's own choices, not how kernels run
NOT_SWITCHES = ("REPRO_GIT_SHA", "REPRO_RESUME_ACROSS_CODE", "REPRO_CACHE", "REPRO_TRITON_CACHE", "REPRO_CMD")
NOT_SWITCHES += ("REPRO_SUITES_DIR", "REPRO_TORCH", "REPRO_GPU_FULL", "REPRO_NIGHTLY_")


def kernel_switches(env: Mapping[str, str]) -> dict[str, str]:
    """The kernel switches among REPRO_* variables ``env`` (:func:`repro_env`): all but
    :data:`NOT_SWITCHES` (matched as prefixes)."""
    return {k: v for k, v in env.items() if not k.startswith(NOT_SWITCHES)}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def build_manifest(config: dict[str, Any], seed: int | None = None) -> dict[str, Any]:
    """The manifest of a new run: environment, seed, full config and its hash, timestamps."""
    dev = device_info()
    now = _now()
    return {
        "repro_version": __version__,
        "git_sha": git_sha(),
        "versions": package_versions(),
        "platform": platform.platform(),
        "device": dev["description"],
        "device_info": dev,
        "device_class": device_class(dev, config),
        "argv": list(sys.argv),
        "repro_env": repro_env(),
        "seed": config.get("seed") if seed is None else seed,
        "config": config,
        "config_hash": config_hash(config),
        "created_at": now,
        "updated_at": now,
    }


def write_json(path: Path, obj: Any) -> Path:
    """``obj`` as indented JSON with a final newline."""
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    return path
