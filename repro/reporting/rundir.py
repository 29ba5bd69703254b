"""Run directories: the one writer and reader of every output kind.

A run directory holds ``manifest.json`` (its ``kind``, environment, the full resolved config, the
fingerprints of the checkpoints and prompt suites it uses and the hash of all three, the ``outputs``
it wrote) and
``records.jsonl``: one JSON record per line, validated by the kind, appended and fsynced as soon
as it is measured, so an interrupted run loses at most the line being written. Everything else
(report.md, CSV tables, figures) is rebuilt from those two files by the kind's report builder
(:func:`rebuild_report`, ``repro report DIR``).

Rules shared by every kind:

- one writer at a time: an exclusive ``flock`` on ``DIR/.lock`` held for the writer's lifetime (also by
  :func:`rebuild_report`), released by the kernel when the writer ends (a killed one leaves no stale lock);
- a directory that exists and is not empty must be a run directory of the same kind, config hash (of
  the config and the contents of the checkpoints and suites it reads) and seed, or hold only ``shards/``
  of one (:func:`check_target`, before the lock is taken); a resumable kind (decode) then resumes, the
  others refuse (they never overwrite a run); a manifest that does not match its own hash, or whose
  entries have the wrong JSON type, is refused;
- every check runs before anything is written, the kind's record check too (``RunDir(check=...)``);
- a resume runs the code (git sha) that began the run: records of two code versions are not mixed
  unless ``REPRO_RESUME_ACROSS_CODE=1`` says so, and then every session's sha stays in the manifest
  (``resumes``) and in the report's header; nor are those of two settings of the kernel switches
  (``REPRO_*`` variables, kept in each ``resumes`` entry);
- a run writes only the files its kind declares (``RunKind.outputs``) and lists them in the manifest;
- file-system errors (read-only, full) become one line naming the path (:class:`RunDirError`);
- a finished run can be archived (:func:`archive_records`, ``repro archive DIR``): its records compressed
  into ``records.jsonl.xz`` (a tenth of the bytes: committed results travel with every GPU call), read back
  as before; no writer resumes it until it is restored (``repro archive --restore DIR``).
"""

from __future__ import annotations

import fcntl
import json
import lzma
import os
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from repro.errors import ReproError, RunDirError
from repro.reporting.records import (
    ARCHIVED_RECORDS_FILE,
    MANIFEST_FILE,
    RECORDS_FILE,
    DecodeRecord,
    RecordsWarning,
    _now,
    build_manifest,
    canonical_json,
    config_hash,
    device_class,
    kernel_switches,
)

LOCK_FILE = ".lock"
SHARDS_DIR = "shards"  # the run directories of a data-parallel run's shards (repro.harness.parallel)
SHARD_NAME = re.compile(r"rank-(\d+)")  # the folder of shard K under SHARDS_DIR
DECODE = "decode"


@dataclass(frozen=True)
class RunKind:
    """What a kind of run directory holds and how its report is rebuilt.

    ``parse`` validates one record dict and returns the record (ValueError when invalid); ``key``
    gives a record's identity within a run (duplicates are refused), None when records have none;
    ``report`` takes (:class:`Run`, figures folder or None) and returns the markdown (None: a kind read
    for its records only, :data:`DECODE_RECORDS`, whose report is not built from here); ``outputs`` are
    the files the report may write inside the directory. Each kind is declared by the module that
    builds its report (the decode kind in ``repro.reporting.report``); ``repro.harness.run_kinds`` lists
    them all for ``repro report``.
    """

    name: str
    parse: Callable[[dict[str, Any]], Any]
    report: Callable[[Run, Path | None], str] | None
    outputs: tuple[str, ...]
    key: Callable[[Any], tuple] | None = None
    resumable: bool = False
    dumps: Callable[[Any], str] = canonical_json  # one JSON line (no newline)


def fields_parser(*required: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A parser for dict records: a JSON object holding at least ``required``."""

    def parse(d: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, got {type(d).__name__}")
        missing = [k for k in required if k not in d]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        return d

    return parse


DECODE_RECORDS = RunKind(
    DECODE,
    DecodeRecord.from_dict,
    None,
    ("report.md", "summary.csv", "histogram.csv", "acceptance.csv", "accept_histogram.png", "acceptance.png"),
    key=lambda r: r.key,
    resumable=True,
    dumps=lambda r: r.to_json(),
)
"""A decode run's records (one :class:`DecodeRecord` a line, resumable), read back by :func:`load_run` by
default; the decode kind with its report is :data:`repro.reporting.report.DECODE_KIND`."""


def infer_kind(manifest: dict[str, Any]) -> str:
    """The kind of a manifest: its ``kind`` key, else (manifests written before kinds existed) from
    the config's content: ``bench: kernels|model`` (the benches), ``check: tree-exactness`` (falsify),
    ``routes`` (a decode experiment), ``targets`` + ``prompt_len`` (the family report)."""
    if "kind" in manifest:
        return str(manifest["kind"])
    cfg = manifest.get("config")
    if not isinstance(cfg, dict):
        raise RunDirError("its manifest has no 'kind' and no config object")
    if cfg.get("bench") in ("kernels", "model"):
        return f"bench-{cfg['bench']}"
    if cfg.get("check") == "tree-exactness":
        return "falsify-tree-exactness"
    if "routes" in cfg:
        return DECODE
    if "targets" in cfg and "prompt_len" in cfg:
        return "family-report"
    raise RunDirError("its manifest has no 'kind' and its config matches no known kind")


Kinds = Mapping[str, RunKind]


def run_kind(name: str, kinds: Kinds) -> RunKind:
    if name not in kinds:
        raise RunDirError(f"unknown run kind {name!r}; known: {', '.join(kinds)}")
    return kinds[name]


FIGURES_OWNER = ".repro-run"  # in a figures folder outside its run: the run's path, relative to it
FINGERPRINTS = ("checkpoints", "suites")  # manifest keys: fingerprints of what a run reads
ACROSS_CODE_ENV = "REPRO_RESUME_ACROSS_CODE"


LOCATION = "path"  # a checkpoint fingerprint's directory: information, not part of the config hash


def contents(fingerprints: Mapping[str, Any]) -> dict[str, Any]:
    """Checkpoint fingerprints without where the checkpoints lie (the same files elsewhere, e.g. another
    checkout or machine, are the same inputs)."""
    return {
        name: {k: v for k, v in fp.items() if k != LOCATION} if isinstance(fp, dict) else fp
        for name, fp in fingerprints.items()
    }


def run_hash(manifest: Mapping[str, Any], locations: bool = False) -> str:
    """The config hash of a run: of its config alone, or of the config and the fingerprints of the
    checkpoints (their contents, not their paths unless ``locations``: manifests written before the hash
    left them out) and suites it reads (those it records)."""
    inputs = {key: manifest[key] for key in FINGERPRINTS if manifest.get(key)}
    if "checkpoints" in inputs and not locations:
        inputs["checkpoints"] = contents(inputs["checkpoints"])
    return config_hash({"config": manifest["config"], **inputs} if inputs else manifest["config"])


def edited(manifest: Mapping[str, Any]) -> str | None:
    """Why a stored manifest's ``config_hash`` is not the hash of its own config and fingerprints (it was
    edited by hand), or None."""
    if manifest["config_hash"] in (run_hash(manifest), run_hash(manifest, locations=True)):
        return None
    return (
        f"has a {MANIFEST_FILE} whose config_hash {str(manifest['config_hash'])[:12]} is not the hash of its"
        f" config and fingerprints ({run_hash(manifest)[:12]}): it was edited"
    )


def code_change(was: str | None, now: str | None) -> str | None:
    """Why records of git sha ``was`` may not be mixed with ``now``'s, or None (same code, or
    $REPRO_RESUME_ACROSS_CODE=1)."""
    if was == now or os.environ.get(ACROSS_CODE_ENV) == "1":
        return None
    return (
        f"was written by git sha {was}, this is {now} (records of two code versions are not mixed;"
        f" {ACROSS_CODE_ENV}=1 mixes them, each session's sha kept in the manifest)"
    )


def switch_change(was: Mapping[str, str] | None, now: Mapping[str, str]) -> str | None:
    """Why a run begun under the REPRO_* variables ``was`` may not be resumed under ``now`` (a kernel
    switch set, unset or changed: :func:`kernel_switches`), or None (also for manifests without them)."""
    if not isinstance(was, Mapping):
        return None
    a, b = kernel_switches(was), kernel_switches(now)
    changed = [
        f"{k}={a.get(k, 'unset')} -> {b.get(k, 'unset')}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]
    if not changed:
        return None
    return (
        f"was run under other kernel switches ({', '.join(changed)}; timings of two settings are not mixed)"
    )


def changed_checkpoint(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """``"<name>: <dir>/<file> changed"`` for the first file whose fingerprint differs, else None."""
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        if a is None or b is None:
            return f"{name}: {(b or a)['path']} was {'added' if a is None else 'removed'}"
        for file in sorted(set(a["files"]) | set(b["files"])):
            if a["files"].get(file) != b["files"].get(file):
                return f"{name}: {Path(b['path']) / file} changed"
    return None


def changed_suites(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """``"<suite>: sha256 <a> -> <b>"`` for the first suite whose file differs, else None."""
    for name in sorted(set(old) | set(new)):
        a, b = (old.get(name) or {}).get("sha256"), (new.get(name) or {}).get("sha256")
        if a != b:
            return f"{name}: sha256 {str(a)[:12]} -> {str(b)[:12]}"
    return None


# ------------------------------------------------------------------------------ file helpers


def recorded_device_class(manifest: dict[str, Any]) -> str | None:
    """The device class a manifest was measured on (older manifests: from their ``device_info``)."""
    if "device_class" in manifest:
        return str(manifest["device_class"])
    info = manifest.get("device_info")
    return device_class(info, manifest.get("config")) if isinstance(info, dict) else None


def os_error(path: Path | str, exc: OSError) -> RunDirError:
    """One line naming the path and the OS error (read-only or full file system, ...)."""
    return RunDirError(f"cannot write {path}: {exc.strerror or exc}")


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write via a temporary file + fsync + rename; OSError becomes RunDirError."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise os_error(path, e) from None


def check_overwrite(path: Path, heading: str) -> None:
    """Refuse (RunDirError), reading only, to write a one-file report over ``path`` unless it is new or an
    earlier report of its kind (its first line starts with ``heading``): never over a file (a run's
    records, notes) the command did not write."""
    if not path.exists():
        return
    try:
        with open(path, "rb") as f:
            first = f.readline()
    except OSError as e:
        raise RunDirError(f"cannot read {path}: {e.strerror or e}") from None
    if not first.startswith(heading.encode("utf-8")):
        raise RunDirError(
            f"{path} exists and is not a report this command wrote (its first line is not '{heading}');"
            " choose another --out (nothing was written)"
        )


def manifest_text(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, indent=2, default=str) + "\n"


def read_json(path: Path, error: type[ReproError], hint: str = "") -> Any:
    """The parsed JSON of ``path``, or one line (an ``error``) saying it cannot be read or is not JSON, with
    ``hint`` after the latter."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path} is not valid JSON ({e}){'; ' + hint if hint else ''}") from None


def read_manifest(path: Path, writing: bool = False) -> dict[str, Any]:
    """The manifest of a run directory; one line saying what is wrong and that the records are intact
    (``writing``: for a command that would write there, which could use another ``--out``)."""
    mpath = path / MANIFEST_FILE
    keep = f"{RECORDS_FILE} is untouched: restore {MANIFEST_FILE} (e.g. from git or a backup)"
    keep += " or use another --out" if writing else ""
    manifest = read_json(mpath, RunDirError, keep)
    if why := manifest_problem(manifest):
        raise RunDirError(f"{mpath} is not a run manifest ({why}); {keep}")
    return manifest


# the JSON type of the manifest entries that reading, resuming and merging use (when present)
_MANIFEST_TYPES: dict[str, tuple[type, ...]] = {
    "config_hash": (str,),
    "config": (dict,),
    "kind": (str,),
    "resumes": (list,),
    "outputs": (list,),
    "checkpoints": (dict, type(None)),
    "suites": (dict, type(None)),
    "repro_env": (dict,),
}


def manifest_problem(manifest: Any) -> str | None:
    """What makes ``manifest`` (parsed JSON) unusable as a run manifest, or None: not an object, no
    config_hash or config, an entry of the wrong JSON type, a resumes entry or output that is not an
    object or a name."""
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not an object"
    missing = [key for key in ("config_hash", "config") if key not in manifest]
    if missing:
        return f"no {' or '.join(missing)}"
    for key, types in _MANIFEST_TYPES.items():
        if key in manifest and not isinstance(manifest[key], types):
            return f"{key} is {type(manifest[key]).__name__}, not {' or '.join(t.__name__ for t in types)}"
    if not all(isinstance(entry, dict) for entry in manifest.get("resumes", [])):
        return "resumes holds an entry that is not an object"
    if not all(isinstance(name, str) for name in manifest.get("outputs", [])):
        return "outputs holds an entry that is not a file name"
    return None


@dataclass
class Scan:
    records: list[tuple[int, Any]]  # (line number, parsed record)
    valid_bytes: int  # length of the file up to and including its last newline
    size: int  # length of the file when scanned
    truncated: bool  # bytes after the last newline (an interrupted write)


def records_bytes(path: Path) -> bytes | None:
    """The bytes of the records file ``path`` (records.jsonl), read from its archived form
    (records.jsonl.xz beside it, :func:`archive_records`) when that is there instead; None without either.
    ReproError with both (two versions of the records: which one is the run's is not guessed) or with an
    archive that does not decompress."""
    archived = path.with_name(ARCHIVED_RECORDS_FILE)
    if not archived.exists():
        return path.read_bytes() if path.exists() else None
    if path.exists():
        raise ReproError(
            f"{path.parent} holds both {RECORDS_FILE} and {ARCHIVED_RECORDS_FILE}: keep the run's one, delete"
            " the other"
        )
    try:
        return lzma.decompress(archived.read_bytes())
    except lzma.LZMAError as e:
        raise ReproError(f"{archived} does not decompress ({e}): restore it from git or a backup") from None


def scan_records(path: Path, kind: RunKind, warn: bool = True) -> Scan:
    """Parse records.jsonl (or its archive, :func:`records_bytes`); a last line without newline is ignored
    (warning), other bad lines raise."""
    data = records_bytes(path)
    if data is None:
        return Scan([], 0, 0, False)
    end = data.rfind(b"\n") + 1
    truncated = end < len(data)
    if truncated and warn:
        warnings.warn(
            f"{path}: ignoring a truncated last line ({len(data) - end} bytes, an interrupted write);"
            " it is removed on the next append",
            RecordsWarning,
            stacklevel=3,
        )
    records: list[tuple[int, Any]] = []
    seen: dict[tuple, int] = {}
    for lineno, raw in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        try:
            rec = kind.parse(json.loads(raw.decode("utf-8")))
            key = kind.key(rec) if kind.key is not None else None
            hash(key)
        except Exception as e:  # noqa: BLE001 - any malformed line is one line of text, not a traceback
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ReproError(
                f"{path} line {lineno} is not a valid record of a {kind.name} run ({msg});"
                " fix or delete that line"
            ) from None
        if key is not None:
            if key in seen:
                raise ReproError(
                    f"{path} line {lineno} repeats the record of line {seen[key]} ({key}); delete one of them"
                )
            seen[key] = lineno
        records.append((lineno, rec))
    return Scan(records, end, len(data), truncated)


# ----------------------------------------------------------------------------------- reading


@dataclass
class Run:
    """A run directory as read back: its kind, manifest and records (for report builders)."""

    path: Path
    kind: RunKind
    manifest: dict[str, Any]
    records: list[Any]
    written: list[str] = field(default_factory=list)

    def write(self, name: str, data: str | bytes) -> Path:
        """Write one of the kind's declared outputs (atomically)."""
        if name not in self.kind.outputs:
            raise ValueError(f"{name} is not an output of a {self.kind.name} run directory")
        atomic_write(self.path / name, data)
        self.written.append(name)
        return self.path / name

    def figures_dir(self, override: str | Path | None = None) -> Path:
        """Where figures go: ``override``, else the manifest's ``figures_dir`` (relative to the run
        directory), else ``<run>/figures``."""
        folder = (
            Path(override)
            if override is not None
            else self.path / self.manifest.get("figures_dir", "figures")
        )
        claim_figures_dir(folder, self.path)
        return folder


def check_figures_dir(folder: Path, run_path: Path) -> bool:
    """Whether the run at ``run_path`` owns the figures folder ``folder`` already (inside the run, or claimed
    by it), reading only; RunDirError when it may not write there: a folder outside the run that already
    holds files without that claim or belongs to another run (figures are never written over files a run
    did not write). Commands call it before their run directory is opened."""
    run = run_path.resolve()
    if folder.resolve().is_relative_to(run):
        return True
    owner = folder / FIGURES_OWNER
    if owner.is_file():
        claimed = owner.read_text(encoding="utf-8").strip()
        if (folder / claimed).resolve() != run:
            raise RunDirError(
                f"figures folder {folder} belongs to the run {claimed} (its {FIGURES_OWNER});"
                " choose another --figures"
            )
        return True
    if folder.is_dir() and any(folder.iterdir()):
        raise RunDirError(
            f"figures folder {folder} holds files this run did not write; choose another --figures (nothing"
            " was overwritten)"
        )
    return False


def claim_figures_dir(folder: Path, run_path: Path) -> None:
    """Let the run at ``run_path`` write figures into ``folder`` (:func:`check_figures_dir`): one outside
    the run, new or empty, is claimed with a ``FIGURES_OWNER`` file naming the run."""
    if check_figures_dir(folder, run_path):
        return
    run = run_path.resolve()
    owner = folder / FIGURES_OWNER
    try:
        folder.mkdir(parents=True, exist_ok=True)
        owner.write_text(os.path.relpath(run, folder.resolve()) + "\n", encoding="utf-8")
    except OSError as e:
        raise os_error(folder, e) from None


def _resolve(path: str | Path) -> Path:
    path = Path(path)
    if path.is_file() and path.name in (RECORDS_FILE, ARCHIVED_RECORDS_FILE, MANIFEST_FILE):
        path = path.parent
    if not path.exists():
        raise ReproError(f"run directory {path} does not exist")
    if not path.is_dir():
        raise ReproError(f"{path} is not a run directory (give the folder holding {MANIFEST_FILE})")
    if not (path / MANIFEST_FILE).exists():
        raise ReproError(f"{path} has no {MANIFEST_FILE}: is it a run directory?")
    return path


def load_run(path: str | Path, kinds: Kinds | None = None, require_records: bool = False) -> Run:
    """A run directory (or its records.jsonl / manifest.json) of one of ``kinds`` (default: decode runs'
    records, :data:`DECODE_RECORDS`; every kind: ``repro.harness.run_kinds.KINDS``) read back; ReproError
    when unusable."""
    path = _resolve(path)
    if require_records and not has_records(path):
        raise ReproError(f"{path} has no {RECORDS_FILE}: the run produced no records yet")
    manifest = read_manifest(path)
    try:
        kind = run_kind(infer_kind(manifest), kinds or {DECODE: DECODE_RECORDS})
    except RunDirError as e:
        raise RunDirError(f"{path}: {e}") from None
    scan = scan_records(path / RECORDS_FILE, kind)
    return Run(path, kind, manifest, [r for _, r in scan.records])


def has_records(path: Path) -> bool:
    """Whether the run directory ``path`` holds records (records.jsonl, or archived)."""
    return (path / RECORDS_FILE).is_file() or (path / ARCHIVED_RECORDS_FILE).is_file()


def archive_records(path: str | Path, kinds: Kinds) -> tuple[int, int] | None:
    """Compress a finished run's records.jsonl into records.jsonl.xz (xz -9e) under the run's lock, after
    reading every record back (a run of one of ``kinds``, no interrupted last line) and checking that the
    archive decompresses to the same bytes; then remove records.jsonl. Returns (bytes before, after), or
    None when the run is archived already. ReproError for a run without records or with an interrupted
    write (finish or resume it first)."""
    path = _resolve(path)
    plain, archived = path / RECORDS_FILE, path / ARCHIVED_RECORDS_FILE
    with lock_dir(path):
        if archived.exists() and not plain.exists():
            return None
        load_run(path, kinds, require_records=True)  # every record parses as its kind's
        data = plain.read_bytes()
        if not data.endswith(b"\n"):
            raise ReproError(f"{plain} ends in an interrupted write: resume or finish the run, then archive")
        packed = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)
        if lzma.decompress(packed) != data:  # never drop records the archive does not give back
            raise ReproError(f"{archived} would not give {plain} back; nothing was changed")
        atomic_write(archived, packed)
        try:
            plain.unlink()
        except OSError as e:
            raise os_error(plain, e) from None
    return len(data), len(packed)


def restore_records(path: str | Path) -> bool:
    """Decompress an archived run's records back into records.jsonl (so that a writer may resume it), under
    the run's lock; False when it is not archived. Refuses to write over a records.jsonl."""
    path = _resolve(path)
    plain, archived = path / RECORDS_FILE, path / ARCHIVED_RECORDS_FILE
    with lock_dir(path):
        if not archived.exists():
            return False
        data = records_bytes(plain)  # ReproError when records.jsonl is there too
        assert data is not None
        atomic_write(plain, data)
        try:
            archived.unlink()
        except OSError as e:
            raise os_error(archived, e) from None
    return True


def load_records(path: str | Path, kinds: Kinds | None = None) -> tuple[dict[str, Any], list[Any]]:
    """(manifest, records) of a run directory (or of its records.jsonl) that has records."""
    run = load_run(path, kinds, require_records=True)
    return run.manifest, run.records


def _report_of(kind: RunKind) -> Callable[[Run, Path | None], str]:
    """The kind's report builder; RunDirError for a kind read for its records only."""
    if kind.report is None:
        raise RunDirError(f"{kind.name} runs read as records only build no report here")
    return kind.report


def rebuild_report(path: str | Path, kinds: Kinds, figures: str | Path | None = None) -> str:
    """Rebuild report.md, tables and figures of a run of one of ``kinds`` from records + manifest, under the
    run's lock (not while a writer holds it); returns the markdown."""
    with lock_dir(_resolve(path)):  # before reading: the records are those no writer is adding to
        run = load_run(path, kinds)
        try:
            return _report_of(run.kind)(run, run.figures_dir(figures))
        except OSError as e:
            raise os_error(e.filename or run.path, e) from None


# ----------------------------------------------------------------------------------- writing


def new_manifest(manifest: dict[str, Any], kind: RunKind) -> dict[str, Any]:
    """The manifest a new run of ``kind`` writes: ``manifest`` (with its ``config``) over the environment
    of :func:`build_manifest`, its ``kind`` and its ``config_hash`` (:func:`run_hash`)."""
    new = {**build_manifest(manifest["config"], manifest.get("seed")), **manifest, "kind": kind.name}
    new["config_hash"] = run_hash(manifest)
    return new


def refusal(path: Path, why: str) -> RunDirError:
    """The one-line refusal to write into the output directory ``path``."""
    return RunDirError(f"output directory {path} {why}; choose another --out or delete it")


def other_run(old: dict[str, Any], new: Mapping[str, Any]) -> str | None:
    """Why the run of manifest ``old`` is not the run ``new`` describes (kind, config hash with the
    checkpoints and suites it reads, seed), or None; a manifest not matching its own hash is none."""
    if why := edited(old):
        return why
    try:
        old_kind = infer_kind(old)
    except RunDirError:
        old_kind = "unknown"
    if old_kind != new["kind"]:
        return f"holds a {old_kind} run, not a {new['kind']} run"
    if run_hash(old) != new["config_hash"]:
        same_config = old.get("config") == new["config"]
        changed = changed_checkpoint(old.get("checkpoints") or {}, new.get("checkpoints") or {})
        if changed and same_config:
            return f"was run with other checkpoint contents ({changed})"
        suites = changed_suites(old.get("suites") or {}, new.get("suites") or {})
        if suites and same_config:
            return f"was run with other prompt suite contents ({suites})"
        return (
            f"holds a run of a different configuration (config hash {str(old['config_hash'])[:12]} !="
            f" {new['config_hash'][:12]})"
        )
    if old.get("seed") != new.get("seed"):
        return f"holds a run of a different seed ({old.get('seed')} != {new.get('seed')})"
    return None


def foreign_content(path: Path, keep: tuple[str, ...] = (LOCK_FILE,)) -> list[str]:
    """The names in directory ``path`` other than ``keep`` (sorted)."""
    return sorted(p.name for p in path.iterdir() if p.name not in keep)


def not_empty(path: Path, keep: tuple[str, ...] = (LOCK_FILE,)) -> str | None:
    """``"is not empty (a, b and N more)"`` when the directory ``path`` holds names other than ``keep``, else
    None (also when there is no such directory)."""
    content = foreign_content(path, keep) if path.is_dir() else []
    if not content:
        return None
    shown = ", ".join(content[:5]) + (f" and {len(content) - 5} more" if len(content) > 5 else "")
    return f"is not empty ({shown})"


def lock_dir(path: Path) -> IO[str]:
    """An exclusive ``flock`` on ``path/.lock``, held while the returned file is open; the kernel releases it
    when the holder ends, so a killed writer leaves no stale lock. RunDirError (naming the holder's pid)
    while another process holds it."""
    lock_path = path / LOCK_FILE
    try:
        f = open(lock_path, "a+")  # noqa: SIM115 - held open for the writer's lifetime
    except OSError as e:
        raise os_error(lock_path, e) from None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read().strip() or "?"
        f.close()
        raise RunDirError(f"another repro process is writing {path} (pid {pid})") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def check_target(path: Path, new: Mapping[str, Any]) -> None:
    """Refuse (RunDirError), reading only, to write the run of manifest ``new`` (with its ``kind`` and
    ``config_hash``) into ``path``: a path that is not a directory; a directory that is not empty and is
    not a run of the same kind, config and seed; a ``shards/`` folder (:mod:`repro.harness.parallel`)
    holding anything but runs of that same configuration (``rank-K`` folders, empty or not)."""
    if path.exists() and not path.is_dir():
        raise RunDirError(f"output path {path} exists and is not a directory; choose another --out")
    if not path.is_dir():
        return
    if (path / MANIFEST_FILE).exists():
        if why := other_run(read_manifest(path, writing=True), new):
            raise refusal(path, why)
        if (path / ARCHIVED_RECORDS_FILE).exists():
            raise RunDirError(
                f"output directory {path} holds an archived run ({ARCHIVED_RECORDS_FILE}); `repro archive"
                f" --restore {path}` to resume it, or choose another --out"
            )
    elif why := not_empty(path, (LOCK_FILE, SHARDS_DIR)):
        raise RunDirError(
            f"output directory {path} {why} and has no {MANIFEST_FILE},"
            " so it is not a run directory; choose another --out (nothing was written)"
        )
    shards = path / SHARDS_DIR
    if shards.exists() and not shards.is_dir():
        raise refusal(path, f"holds a file {SHARDS_DIR}, not a folder of shards")
    for shard in sorted(shards.iterdir()) if shards.is_dir() else []:
        if not shard.is_dir() or not SHARD_NAME.fullmatch(shard.name):
            raise refusal(path, f"holds {shard}, not a shard folder (rank-K)")
        if (shard / MANIFEST_FILE).exists():
            if why := other_run(read_manifest(shard, writing=True), new):
                raise refusal(shard, why)
        elif content := foreign_content(shard):
            raise refusal(shard, f"holds files of no run ({', '.join(content[:5])})")


class RunDir:
    """The writer of one run directory: lock, manifest, append-only records, report outputs.

    ``manifest`` must hold ``"config"`` (the full resolved config) and may hold ``"checkpoints"``
    (:func:`repro.models.fingerprint.fingerprint_checkpoints`) and kind-specific keys; missing
    environment fields come from :func:`build_manifest` and ``config_hash`` (config + checkpoints)
    is always recomputed. An existing directory must be empty or a run directory of the same kind,
    config hash and seed; a resumable kind then resumes it (``resumed``), keeping its original
    manifest and appending this session to ``manifest["resumes"]``. ``kind`` is the run's kind (a
    decode run: :data:`repro.reporting.report.DECODE_KIND`). ``check``, when given, is called with the
    (line number, record) pairs a resumed directory already holds, before anything is written; a
    ReproError it raises refuses the resume (e.g. records another configuration wrote).
    """

    def __init__(
        self,
        path: str | Path,
        manifest: dict[str, Any],
        kind: RunKind,
        check: Callable[[list[tuple[int, Any]]], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.kind = kind
        if "config" not in manifest:
            raise ValueError("the manifest passed to RunDir needs the full resolved 'config'")
        new = new_manifest(manifest, kind)
        self.manifest_path = self.path / MANIFEST_FILE
        self.records_path = self.path / RECORDS_FILE
        check_target(self.path, new)  # before the lock: a foreign directory is left as it was
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise os_error(self.path, e) from None
        self._lock = lock_dir(self.path)
        self.resumed = self.manifest_path.exists()
        scan = self._open_existing(new) if self.resumed else Scan([], 0, 0, False)
        if check is not None and scan.records:
            try:
                check(scan.records)
            except ReproError as e:
                self._refuse(f"cannot be resumed: {e}")
        if not self.resumed:
            self.manifest = {**new, "outputs": []}
        self.scanned = scan.records  # the (line number, record) pairs it held when opened
        self._records = [r for _, r in scan.records]
        self._index = {self.kind.key(r): r for r in self._records} if self.kind.key else {}
        self._valid_bytes, self._size, self._truncated = scan.valid_bytes, scan.size, scan.truncated
        self.write_manifest()

    # -- opening

    def _open_existing(self, new: dict[str, Any]) -> Scan:
        old = read_manifest(self.path, writing=True)
        if why := other_run(old, new):
            self._refuse(why)
        was, now = recorded_device_class(old), new["device_class"]
        if was is not None and was != now:
            self._refuse(
                f"was measured on {was}, this machine is {now} (timings of two devices are not mixed)"
            )
        scan = scan_records(self.records_path, self.kind)
        if scan.records and not self.kind.resumable:
            self._refuse(
                f"already holds a finished or interrupted {self.kind.name} run ({len(scan.records)} records)"
            )
        if why := code_change(old.get("git_sha"), new.get("git_sha")):
            self._refuse(why)
        if why := switch_change(old.get("repro_env"), new.get("repro_env") or {}):
            self._refuse(why)
        session = {k: new[k] for k in ("git_sha", "repro_version", "device")}
        session["repro_env"] = new.get("repro_env") or {}
        old.setdefault("resumes", []).append({"at": _now(), **session})
        old["updated_at"] = old["resumes"][-1]["at"]
        old.setdefault("outputs", [])
        self.manifest = old
        return scan

    def _refuse(self, why: str) -> None:
        self.close()
        raise refusal(self.path, why)

    def close(self) -> None:
        """Release the lock (also released when the process ends)."""
        lock = getattr(self, "_lock", None)
        if lock is not None and not lock.closed:
            lock.close()

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing

    @property
    def config_hash(self) -> str:
        return self.manifest["config_hash"]

    def write_manifest(self) -> None:
        atomic_write(self.manifest_path, manifest_text(self.manifest))

    def update_manifest(self, **entries: Any) -> None:
        """Set manifest entries measured during the run (ceilings, model info, notes) and save it."""
        self.manifest.update(entries)
        self.write_manifest()

    def append(self, record: Any) -> Any:
        """Validate, append one JSON line, flush and fsync; refuses a key that is already done."""
        if isinstance(record, dict):
            record = self.kind.parse(record)
        elif isinstance(record, DecodeRecord):
            record.validate()
        key = self.kind.key(record) if self.kind.key else None
        if key is not None and key in self._index:
            raise ValueError(f"record {key} is already in {self.records_path}")
        line = (self.kind.dumps(record) + "\n").encode("utf-8")
        try:
            size = self.records_path.stat().st_size if self.records_path.exists() else 0
            if size != self._size:  # the lock keeps other writers out; never truncate what we did not see
                raise RunDirError(
                    f"{self.records_path} changed while this process was writing it ({self._size} -> {size}"
                    " bytes); rerun to resume from what it holds"
                )
            if self._truncated:  # drop the partial line an interrupted run left behind
                os.truncate(self.records_path, self._valid_bytes)
                self._truncated = False
            with open(self.records_path, "ab") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise os_error(self.records_path, e) from None
        self._valid_bytes += len(line)
        self._size = self._valid_bytes
        self._records.append(record)
        if key is not None:
            self._index[key] = record
        self.manifest["updated_at"] = _now()
        self.write_manifest()
        return record

    def done_keys(self) -> set[tuple]:
        """Keys of every complete record (a truncated last line is not)."""
        return set(self._index)

    def records(self) -> list[Any]:
        """All complete records in file order."""
        return list(self._records)

    def get(self, *key: Any) -> Any:
        """The record of that key, or None."""
        return self._index.get(tuple(key))

    def write_report(self, figures: str | Path | None = None) -> str:
        """Build the kind's report from this run's records and list what it wrote in the manifest.

        ``figures`` (a folder for kinds whose figures live outside the run) is saved in the manifest as
        ``figures_dir`` relative to the run directory, so ``repro report`` rebuilds them in place.
        """
        if figures is not None:
            self.manifest["figures_dir"] = os.path.relpath(Path(figures), self.path)
        run = Run(self.path, self.kind, self.manifest, self.records())
        try:
            text = _report_of(self.kind)(run, run.figures_dir())
        except OSError as e:
            raise os_error(e.filename or self.path, e) from None
        self.manifest["outputs"] = sorted({*self.manifest.get("outputs", []), *run.written})
        self.write_manifest()
        return text
