"""The embedded tiny family: trained checkpoints shipped inside the package, resolved by name.

``repro/assets/family/<name>/`` holds each member in its native format: the targets
``tiny-qwen35`` (Qwen3.5 layout, 3 GDN : 1 gated attention) and ``tiny-gdn`` (fla GatedDeltaNet,
pure GDN), each with its tokenizer, and their drafters ``<target>-dflash`` (z-lab DFlash),
``<target>-eagle`` (EAGLE) and ``<target>-weaver`` (Weaver adapter). ``family.json`` records, per
member, the recipe, seeds, git sha, data manifest sha, held-out metrics and the bytes shipped.
``tiny-random`` is the untrained seeded hybrid (mechanics tests), built rather than stored.

Wherever a target or drafter checkpoint is asked for, a family name may stand in for a path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from repro.errors import CheckpointError, not_a_folder

FAMILY_DIR = Path(__file__).resolve().parents[1] / "assets" / "family"
INDEX_FILE = "family.json"
DEFAULT_TARGET = "tiny-qwen35"
RANDOM_TARGET = "tiny-random"
TARGETS = ("tiny-qwen35", "tiny-gdn")
DRAFTER_KINDS = ("dflash", "eagle", "weaver")
SIZE_BUDGET_BYTES = 24_000_000  # the "at most 24 MB", in decimal megabytes
MEMBER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a plain folder name (no path, not hidden)


def members() -> list[str]:
    """Names of the shipped checkpoints (directories under the family folder)."""
    return [p.name for p in _member_dirs(FAMILY_DIR)]


def _member_dirs(folder: Path) -> list[Path]:
    """The member directories of a family folder: those holding a config.json, sorted; hidden ones
    (an install's temporary copies) are not members."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".") and (p / "config.json").is_file())


def index() -> dict[str, Any]:
    """The family's ``family.json`` (per-member recipe, provenance and held-out metrics)."""
    path = FAMILY_DIR / INDEX_FILE
    if not path.is_file():
        raise CheckpointError(f"the embedded family has no {INDEX_FILE} at {FAMILY_DIR}")
    return json.loads(path.read_text())


def resolve_checkpoint(spec: str | Path, what: str = "checkpoint") -> Path:
    """A family member's directory for its name, else ``spec`` as a local directory that exists."""
    name = str(spec)
    if name in members():
        return FAMILY_DIR / name
    path = Path(spec)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{what} {name} is not a directory")
    if not path.is_dir():
        known = ", ".join(members()) or "none shipped"
        raise CheckpointError(f"{what} {name} does not exist (no such directory; embedded models: {known})")
    return path


def drafter_name(target: str, kind: str) -> str:
    """The embedded drafter of ``kind`` trained for the embedded ``target``."""
    return f"{target}-{kind}"


SHIPPED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "repro_tokenizer.json",
    "metrics.json",
    "manifest.json",
)


REQUIRED_FILES = ("config.json", "model.safetensors")  # what makes a run folder a trained member


def install(runs: Path, names: list[str], dest: Path | None = None, force: bool = False) -> dict[str, Any]:
    """Copy trained members ``runs/<name>`` (from ``scripts/gpu_train.sh``) into the family folder
    ``dest`` (default :data:`FAMILY_DIR`).

    Only the files a loader needs plus metrics and manifest travel (logs and figures stay with the
    run's results). Every name and source is checked before anything is written (CheckpointError,
    nothing installed): a plain folder name, named once, a run folder holding ``REQUIRED_FILES``, no
    existing member of that name unless ``force``, and the whole family within ``SIZE_BUDGET_BYTES``.
    Each member is then copied into a temporary folder in ``dest`` and renamed into place (a replaced
    member is moved aside first and deleted after), so a member is never half-written; ``family.json``
    is rewritten last (atomically) with each member's provenance and held-out metrics.
    """
    dest = FAMILY_DIR if dest is None else dest
    sources = _check_install(runs, names, dest, force)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot create the family folder {dest}: {e.strerror or e}") from None
    staged: dict[str, Path] = {}
    umask = os.umask(0)
    os.umask(umask)
    try:
        for name, src in sources.items():
            staged[name] = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".installing", dir=dest))
            staged[name].chmod(0o777 & ~umask)  # mkdtemp's 0700 would make the member private
            for f in SHIPPED_FILES:
                if (src / f).is_file():
                    shutil.copyfile(src / f, staged[name] / f)
    except OSError as e:
        for tmp in staged.values():
            shutil.rmtree(tmp, ignore_errors=True)
        where = e.filename or dest
        raise CheckpointError(
            f"cannot copy into {dest} ({where}: {e.strerror or e}); nothing was installed"
        ) from None
    placed: list[str] = []
    try:
        for name, tmp in staged.items():
            _place(tmp, dest / name)
            placed.append(name)
    except OSError as e:
        for tmp in staged.values():
            shutil.rmtree(tmp, ignore_errors=True)
        _write_index(dest)
        done = ", ".join(placed) or "none"
        raise CheckpointError(
            f"cannot move {e.filename or dest} into place: {e.strerror or e} (installed: {done})"
        ) from None
    return _write_index(dest)


def _check_install(runs: Path, names: list[str], dest: Path, force: bool) -> dict[str, Path]:
    """``{name: run folder}`` when every member of ``names`` can be installed into ``dest``; else one
    CheckpointError naming every problem found."""
    if not runs.is_dir():
        raise CheckpointError(not_a_folder(runs, "training run folder") + " (nothing was installed)")
    problems: list[str] = []
    for name in dict.fromkeys(n for n in names if names.count(n) > 1):
        problems.append(f"{name} is named twice")
    sources: dict[str, Path] = {}
    for name in dict.fromkeys(names):
        src = runs / name
        missing = [f for f in REQUIRED_FILES if not (src / f).is_file()]
        if not MEMBER_NAME.fullmatch(name):
            problems.append(f"{name!r} is not a member name (a plain folder name)")
        elif name == RANDOM_TARGET:
            problems.append(f"{name} is built, not installed")
        elif not src.is_dir():
            problems.append(f"{src} does not exist")
        elif missing:
            problems.append(f"{src} is not a trained checkpoint (no {', '.join(missing)})")
        elif (dest / name).exists() or (dest / name).is_symlink():
            if not force:
                problems.append(f"{name} is already installed in {dest} (--force replaces it)")
            elif not (dest / name / "config.json").is_file():
                problems.append(f"{dest / name} exists and is not a family member; move it away")
            else:
                sources[name] = src
        else:
            sources[name] = src
    if problems:
        raise CheckpointError("; ".join(problems) + " (nothing was installed)")
    try:
        kept = sum(_size(m) for m in _member_dirs(dest) if m.name not in sources)
        total = kept + sum(_size(src, SHIPPED_FILES) for src in sources.values())
    except OSError as e:
        raise CheckpointError(
            f"cannot read {e.filename}: {e.strerror or e} (nothing was installed)"
        ) from None
    if total > SIZE_BUDGET_BYTES:
        raise CheckpointError(
            f"the family would hold {total} bytes, over its {SIZE_BUDGET_BYTES}-byte budget"
            " (nothing was installed)"
        )
    return sources


def _size(folder: Path, files: tuple[str, ...] | None = None) -> int:
    """Bytes of the files directly in ``folder`` (only those named ``files`` when given)."""
    paths = [folder / f for f in files] if files is not None else list(folder.iterdir())
    return sum(p.stat().st_size for p in paths if p.is_file())


def _place(staged: Path, out: Path) -> None:
    """Rename the staged copy ``staged`` to ``out``; an existing ``out`` is moved aside first (and put
    back when the rename fails) and deleted once the new one is in place."""
    if not (out.exists() or out.is_symlink()):
        os.rename(staged, out)
        return
    aside = out.with_name(f".{out.name}.{os.getpid()}.replaced")
    os.rename(out, aside)
    try:
        os.rename(staged, out)
    except OSError:
        os.rename(aside, out)
        raise
    if aside.is_symlink():
        aside.unlink()
    else:
        shutil.rmtree(aside, ignore_errors=True)


def _write_index(dest: Path) -> dict[str, Any]:
    """Rewrite ``dest/family.json`` from the members on disk (atomically) and return it."""
    entries: dict[str, Any] = {}
    total = 0
    for member in _member_dirs(dest):
        size = _size(member)
        total += size
        manifest = _read_json(member / "manifest.json")
        config = manifest.get("config", {})
        entries[member.name] = {
            "bytes": size,
            "recipe": config,
            "seed": manifest.get("seed"),
            "git_sha": manifest.get("git_sha"),
            "device": manifest.get("device"),
            "metrics": _read_json(member / "metrics.json"),
        }
    data_manifest = Path(__file__).resolve().parents[2] / "data" / "corpus-manifest.json"
    summary = {
        "default_target": DEFAULT_TARGET,
        "total_bytes": total,
        "budget_bytes": SIZE_BUDGET_BYTES,
        "corpus_manifest_sha256": _sha256(data_manifest) if data_manifest.is_file() else None,
        "members": entries,
    }
    tmp = dest / f".{INDEX_FILE}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(tmp, dest / INDEX_FILE)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"cannot write {dest / INDEX_FILE}: {e.strerror or e}") from None
    return summary


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()
