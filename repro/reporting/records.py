"""Decode records and run directories.

A run directory holds ``manifest.json`` (environment, full resolved config and its hash) and
``records.jsonl``: one :class:`DecodeRecord` per (route, suite, prompt_id, turn), appended and
fsynced as soon as it is produced, so an interrupted run loses at most the line being written.
Reopening a directory with the same config hash resumes it; a different hash is refused.
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
import warnings
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from repro import __version__
from repro.errors import ReproError, RunDirError

MANIFEST_FILE = "manifest.json"
RECORDS_FILE = "records.jsonl"
STAGES = ("draft", "tree", "verify", "commit")
FINISH_REASONS = ("stop", "length")
VS_AR_FIXED = ("reference", "identical", "no reference")
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


def is_ar_route(route: str, route_params: dict[str, Any]) -> bool:
    """The AR baseline is the route whose ``route_params["kind"] == "ar"`` or that is named ``"ar"``."""
    return route == "ar" or route_params.get("kind") == "ar"


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

    @property
    def key(self) -> RecordKey:
        """(route, suite, prompt_id, turn): the identity of a record within a run."""
        return (self.route, self.suite, self.prompt_id, self.turn)

    @property
    def is_ar(self) -> bool:
        return is_ar_route(self.route, self.route_params)

    @property
    def tokens_per_s(self) -> float:
        """new_tokens / decode_s (prefill excluded); NaN when decode_s is not positive."""
        return self.new_tokens / self.decode_s if self.decode_s > 0 else math.nan

    @property
    def mean_accepted_length(self) -> float:
        """sum(accepted_lengths) / steps; NaN when there was no verify step."""
        return sum(self.accepted_lengths) / self.steps if self.steps > 0 else math.nan

    def validate(self) -> None:
        """Raise ValueError when the record is internally inconsistent."""
        if not isinstance(self.turn, int) or self.turn < 0:
            raise ValueError(f"turn must be a non-negative int, got {self.turn!r}")
        if self.new_tokens != len(self.output_ids):
            raise ValueError(f"new_tokens={self.new_tokens} but {len(self.output_ids)} output_ids")
        if self.steps != len(self.accepted_lengths):
            raise ValueError(f"steps={self.steps} but {len(self.accepted_lengths)} accepted_lengths")
        if self.steps != len(self.tree_sizes):
            raise ValueError(f"steps={self.steps} but {len(self.tree_sizes)} tree_sizes")
        if any(a < 1 for a in self.accepted_lengths):
            raise ValueError("accepted lengths include the bonus token and must be >= 1")
        if sum(self.accepted_lengths) != max(self.new_tokens - 1, 0):
            raise ValueError(
                f"sum(accepted_lengths)={sum(self.accepted_lengths)} but new_tokens - 1 ="
                f" {self.new_tokens - 1} (the first new token comes from prefill)"
            )
        missing = [s for s in STAGES if s not in self.stage_s]
        if missing:
            raise ValueError(f"stage_s lacks {', '.join(missing)}")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        if self.vs_ar not in VS_AR_FIXED and not _DIVERGED.match(self.vs_ar):
            raise ValueError(f"vs_ar {self.vs_ar!r} is not one of {VS_AR_FIXED} or 'diverged at token k'")
        if self.output_sha256 != sha256_ids(self.output_ids):
            raise ValueError("output_sha256 does not match sha256_ids(output_ids)")
        if self.decode_s < 0 or self.prefill_s < 0:
            raise ValueError("negative time")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        """One compact JSON line (no trailing newline)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DecodeRecord:
        """Build and validate; unknown keys are ignored, missing keys raise ValueError."""
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, got {type(d).__name__}")
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in d]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        rec = cls(**{n: d[n] for n in names})
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


def git_sha(root: Path | None = None) -> str:
    """``git rev-parse HEAD`` of the checkout the package runs from (+ "-dirty"), else "unknown".

    A copy without ``.git`` (the GPU machine gets the working tree only) reports the sha that the
    sender put in ``REPRO_GIT_SHA``.
    """
    if os.environ.get("REPRO_GIT_SHA"):
        return os.environ["REPRO_GIT_SHA"]
    root = (root or Path(__file__).resolve().parents[2]).resolve()

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20, check=True
        )
        return out.stdout

    try:
        top = Path(git("rev-parse", "--show-toplevel").strip()).resolve()
        if top != root:  # e.g. an installed copy that happens to sit inside another repository
            return "unknown"
        sha = git("rev-parse", "HEAD").strip()
        dirty = git("status", "--porcelain").strip() != ""
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


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


def package_versions() -> dict[str, str]:
    """Versions of python and of those of torch/transformers/numpy/pandas that are installed."""
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "numpy", "pandas"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


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
        "argv": list(sys.argv),
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


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_manifest(path: Path, exc: type[ReproError] = ReproError) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise exc(f"cannot read {path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise exc(f"{path} is not valid JSON ({e}); delete the run directory or use another --out") from None
    if not isinstance(manifest, dict) or "config_hash" not in manifest:
        raise exc(f"{path} is not a run manifest (no config_hash)")
    return manifest


# ------------------------------------------------------------------------------ records file


@dataclass
class _Scan:
    records: list[DecodeRecord]
    valid_bytes: int  # length of the file up to and including its last newline
    truncated: bool  # bytes after the last newline (an interrupted write)


def _scan_records(path: Path, warn: bool = True) -> _Scan:
    """Parse records.jsonl; a last line without newline is ignored (warning), other bad lines raise."""
    if not path.exists():
        return _Scan([], 0, False)
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    truncated = end < len(data)
    if truncated and warn:
        warnings.warn(
            f"{path}: ignoring a truncated last line ({len(data) - end} bytes, an interrupted write);"
            " it is removed on the next append",
            RecordsWarning,
            stacklevel=3,
        )
    records: list[DecodeRecord] = []
    seen: dict[RecordKey, int] = {}
    for lineno, raw in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        try:
            rec = DecodeRecord.from_json(raw.decode("utf-8"))
        except (ValueError, TypeError, KeyError) as e:  # JSON and UTF-8 decode errors are ValueErrors
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ReproError(
                f"{path} line {lineno} is not a valid record ({msg}); fix or delete that line"
            ) from None
        if rec.key in seen:
            raise ReproError(
                f"{path} line {lineno} repeats the record of line {seen[rec.key]} (route={rec.route},"
                f" suite={rec.suite}, prompt={rec.prompt_id}, turn={rec.turn}); delete one of them"
            )
        seen[rec.key] = lineno
        records.append(rec)
    return _Scan(records, end, truncated)


class RunDir:
    """An output directory: manifest.json + append-only records.jsonl, resumable.

    ``manifest`` must hold ``"config"`` (the full resolved config); missing environment fields
    are filled in by :func:`build_manifest` and ``config_hash`` is always recomputed. If the
    directory already holds a manifest with another config hash (or seed), RunDirError; with the
    same one the directory is resumed (``resumed`` is True) and its original manifest kept, with
    this session appended to ``manifest["resumes"]``.
    """

    def __init__(self, path: str | Path, manifest: dict[str, Any]) -> None:
        self.path = Path(path)
        if "config" not in manifest:
            raise ValueError("the manifest passed to RunDir needs the full resolved 'config'")
        new = {**build_manifest(manifest["config"], manifest.get("seed")), **manifest}
        new["config_hash"] = config_hash(manifest["config"])
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"output path {self.path} exists and is not a directory; choose another --out")
        self.manifest_path = self.path / MANIFEST_FILE
        self.records_path = self.path / RECORDS_FILE
        self.resumed = self.manifest_path.exists()
        if self.resumed:
            old = _read_manifest(self.manifest_path, RunDirError)
            if old["config_hash"] != new["config_hash"]:
                raise RunDirError(
                    f"output directory {self.path} holds records of a different configuration (config hash"
                    f" {old['config_hash'][:12]} != {new['config_hash'][:12]});"
                    " choose another --out or delete it"
                )
            if old.get("seed") != new.get("seed"):
                raise RunDirError(
                    f"output directory {self.path} holds records of a different seed ({old.get('seed')} !="
                    f" {new.get('seed')}); choose another --out or delete it"
                )
            session = {
                "at": _now(),
                "git_sha": new["git_sha"],
                "repro_version": new["repro_version"],
                "device": new["device"],
            }
            old.setdefault("resumes", []).append(session)
            old["updated_at"] = session["at"]
            self.manifest = old
        else:
            if self.records_path.exists():
                raise RunDirError(
                    f"output directory {self.path} holds {RECORDS_FILE} but no {MANIFEST_FILE};"
                    " choose another --out or delete it"
                )
            self.path.mkdir(parents=True, exist_ok=True)
            self.manifest = new
        scan = _scan_records(self.records_path)
        self._records = scan.records
        self._index: dict[RecordKey, DecodeRecord] = {r.key: r for r in scan.records}
        self._valid_bytes = scan.valid_bytes
        self._truncated = scan.truncated
        self._write_manifest()

    def _write_manifest(self) -> None:
        _atomic_write_text(self.manifest_path, json.dumps(self.manifest, indent=2, default=str) + "\n")

    @property
    def config_hash(self) -> str:
        return self.manifest["config_hash"]

    def append(self, record: DecodeRecord) -> None:
        """Validate, append one JSON line, flush and fsync; refuses a key that is already done."""
        record.validate()
        if record.key in self._index:
            raise ValueError(f"record {record.key} is already in {self.records_path}")
        line = (record.to_json() + "\n").encode("utf-8")
        if self._truncated:  # drop the partial line an interrupted run left behind
            os.truncate(self.records_path, self._valid_bytes)
            self._truncated = False
        with open(self.records_path, "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self._valid_bytes += len(line)
        self._records.append(record)
        self._index[record.key] = record
        self.manifest["updated_at"] = _now()
        self._write_manifest()

    def done_keys(self) -> set[RecordKey]:
        """(route, suite, prompt_id, turn) of every complete record (a truncated last line is not)."""
        return set(self._index)

    def records(self) -> list[DecodeRecord]:
        """All complete records in file order."""
        return list(self._records)

    def get(self, route: str, suite: str, prompt_id: str, turn: int) -> DecodeRecord | None:
        """The record of that key, or None."""
        return self._index.get((route, suite, prompt_id, turn))


def load_records(path: str | Path) -> tuple[dict[str, Any], list[DecodeRecord]]:
    """(manifest, records) of a run directory (or of its records.jsonl); ReproError when unusable."""
    path = Path(path)
    if path.is_file() and path.name == RECORDS_FILE:
        path = path.parent
    if not path.exists():
        raise ReproError(f"run directory {path} does not exist")
    if not path.is_dir():
        raise ReproError(f"{path} is not a run directory")
    manifest_path, records_path = path / MANIFEST_FILE, path / RECORDS_FILE
    if not manifest_path.exists():
        raise ReproError(f"{path} has no {MANIFEST_FILE}: is it a run directory?")
    if not records_path.exists():
        raise ReproError(f"{path} has no {RECORDS_FILE}: the run produced no records yet")
    manifest = _read_manifest(manifest_path)
    return manifest, _scan_records(records_path).records
