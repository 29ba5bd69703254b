"""Fingerprints of the checkpoints a run uses, so that a resume cannot mix two versions of one.

A checkpoint directory's fingerprint maps each regular file in it (config.json, weights,
tokenizer files) to its size and a content hash that does not depend on mtimes:

- files up to ``FULL_HASH_LIMIT`` (64 MiB; every shipped family member): sha256 of the whole file;
- larger ``.safetensors`` files: sha256 of the safetensors header (8-byte length + JSON header:
  tensor names, dtypes, shapes, offsets) together with the size, so a re-saved checkpoint of
  another shape or layout is caught without reading gigabytes; other large files: sha256 of
  their first MiB together with the size.

Family names (``default``, ``tiny-qwen35-dflash``, ...) resolve to the package's family folder
and are fingerprinted too; ``tiny-random`` (built in code) and ``random`` drafters have no files.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any

FULL_HASH_LIMIT = 64 * 2**20
CHECKPOINT_KEYS = ("drafter", "weaver")  # route parameters that name a checkpoint
BUILT_IN = ("tiny-random", "random")


def file_fingerprint(path: Path) -> dict[str, Any]:
    """``{"size": n, "sha256": hex}`` (whole file), or for a large file ``"head_sha256"`` instead."""
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= FULL_HASH_LIMIT:
            for block in iter(lambda: f.read(2**20), b""):
                h.update(block)
            return {"size": size, "sha256": h.hexdigest()}
        head = f.read(8)
        if path.suffix == ".safetensors" and len(head) == 8:
            (n,) = struct.unpack("<Q", head)
            h.update(head + f.read(min(n, size - 8)))
        else:
            h.update(head + f.read(2**20 - 8))
    return {"size": size, "head_sha256": h.hexdigest()}


def dir_fingerprint(path: Path) -> dict[str, Any]:
    """The resolved directory and the fingerprint of each regular file in it (sorted by name)."""
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    return {"path": str(path), "files": {p.name: file_fingerprint(p) for p in files}}


def fingerprint_checkpoints(cfg: dict[str, Any]) -> dict[str, Any]:
    """Fingerprints of a decode config's target and of the drafter/weaver checkpoints its routes name,
    keyed by how the config names them (``target``, ``<route>.drafter``, ...)."""
    from repro.models.family import DEFAULT_TARGET, resolve_checkpoint

    named: dict[str, str] = {}
    target = str(cfg.get("target", "default"))
    named["target"] = DEFAULT_TARGET if target == "default" else target
    for spec in cfg.get("routes", []):
        for key in CHECKPOINT_KEYS:
            if key in spec:
                named[f"{spec.get('name')}.{key}"] = str(spec[key])
    return {
        name: dir_fingerprint(resolve_checkpoint(spec, name))
        for name, spec in named.items()
        if spec not in BUILT_IN
    }
