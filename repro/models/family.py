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
from pathlib import Path
from typing import Any

from repro.errors import CheckpointError

FAMILY_DIR = Path(__file__).resolve().parents[1] / "assets" / "family"
INDEX_FILE = "family.json"
DEFAULT_TARGET = "tiny-qwen35"
RANDOM_TARGET = "tiny-random"
TARGETS = ("tiny-qwen35", "tiny-gdn")
DRAFTER_KINDS = ("dflash", "eagle", "weaver")
SIZE_BUDGET_BYTES = 24_000_000  # the "at most 24 MB", in decimal megabytes


def members() -> list[str]:
    """Names of the shipped checkpoints (directories under the family folder)."""
    if not FAMILY_DIR.is_dir():
        return []
    return sorted(p.name for p in FAMILY_DIR.iterdir() if (p / "config.json").is_file())


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


def install(runs: Path, names: list[str], dest: Path = FAMILY_DIR) -> dict[str, Any]:
    """Copy trained members ``runs/<name>`` (from ``scripts/gpu_train.sh``) into the family folder.

    Only the files a loader needs plus metrics and manifest travel (logs and figures stay with the
    run's results). ``family.json`` is rewritten with each member's provenance and held-out
    metrics; the whole family must fit in ``SIZE_BUDGET_BYTES``.
    """
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        src = runs / name
        if not (src / "config.json").is_file():
            raise CheckpointError(f"{src} is not a trained checkpoint (no config.json)")
        out = dest / name
        out.mkdir(exist_ok=True)
        for f in SHIPPED_FILES:
            if (src / f).is_file():
                (out / f).write_bytes((src / f).read_bytes())
    entries: dict[str, Any] = {}
    total = 0
    for member in sorted(p for p in dest.iterdir() if (p / "config.json").is_file()):
        size = sum(f.stat().st_size for f in member.iterdir() if f.is_file())
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
    if total > SIZE_BUDGET_BYTES:
        raise CheckpointError(f"the family holds {total} bytes, over its {SIZE_BUDGET_BYTES}-byte budget")
    data_manifest = Path(__file__).resolve().parents[2] / "data" / "corpus-manifest.json"
    summary = {
        "default_target": DEFAULT_TARGET,
        "total_bytes": total,
        "budget_bytes": SIZE_BUDGET_BYTES,
        "corpus_manifest_sha256": _sha256(data_manifest) if data_manifest.is_file() else None,
        "members": entries,
    }
    (dest / INDEX_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()
