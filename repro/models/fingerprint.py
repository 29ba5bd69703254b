"""Fingerprints of the checkpoints a run uses, so that a resume cannot mix two versions of one.

A checkpoint directory's fingerprint maps each regular file in it (config.json, weights,
tokenizer files) to its size and the sha256 of its whole content (independent of mtimes). Files
over ``CACHED_ABOVE`` (64 MiB: real checkpoints' weight shards) are hashed once per version: the
hash is kept in ``<cache>/fingerprints.json`` under the file's path, keyed by its device, inode,
size, mtime and ctime, and read again whenever any of them changes.

A run fingerprints its target and the drafter/weaver checkpoints its routes resolve to (named in
the config or the target family's defaults). Family names (``default``, ``tiny-qwen35-dflash``,
...) resolve to the package's family folder and are fingerprinted too; ``tiny-random`` (built in
code) and ``random`` drafters have no files.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import repro

CACHED_ABOVE = 64 * 2**20
CACHE_FILE = "fingerprints.json"
CHECKPOINT_KEYS = ("drafter", "weaver")  # route parameters that name a checkpoint
BUILT_IN = ("tiny-random", "random")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**22), b""):
            h.update(block)
    return h.hexdigest()


def _version(st: os.stat_result) -> list[int]:
    """What identifies one version of a file on disk without reading it."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def file_fingerprint(path: Path) -> dict[str, Any]:
    """``{"size": n, "sha256": hex}`` of the whole file (large files: through the hash cache)."""
    st = path.stat()
    if st.st_size <= CACHED_ABOVE:
        return {"size": st.st_size, "sha256": _sha256(path)}
    cache_path = repro.cache_dir() / CACHE_FILE
    key = str(path.resolve())
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    entry = cache.get(key) if isinstance(cache, dict) else None
    if isinstance(entry, dict) and entry.get("version") == _version(st):
        return {"size": st.st_size, "sha256": entry["sha256"]}
    digest = _sha256(path)
    if _version(path.stat()) == _version(st):  # unchanged while it was read: worth keeping
        cache = cache if isinstance(cache, dict) else {}
        cache[key] = {"version": _version(st), "sha256": digest}
        try:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_path.with_name(f".{CACHE_FILE}.{os.getpid()}")
            tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
            os.replace(tmp, cache_path)
        except OSError:
            pass  # a read-only cache only costs the next run the hashing
    return {"size": st.st_size, "sha256": digest}


def dir_fingerprint(path: Path) -> dict[str, Any]:
    """The directory and the fingerprint of each regular file in it (sorted by name); the directory is
    information only: a run's config hash covers the files, not where they lie
    (:func:`repro.reporting.rundir.run_hash`)."""
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    return {"path": str(path), "files": {p.name: file_fingerprint(p) for p in files}}


def fingerprint_checkpoints(target: str, routes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Fingerprints of the ``target`` and of the drafter/weaver checkpoints of ``routes`` (resolved
    route parameters, each with its ``name``: defaults from the target's family included), keyed
    ``target`` / ``<route>.drafter`` / ``<route>.weaver``."""
    from repro.models.family import DEFAULT_TARGET, resolve_checkpoint

    named: dict[str, str] = {"target": DEFAULT_TARGET if target == "default" else str(target)}
    for params in routes:
        for key in CHECKPOINT_KEYS:
            if params.get(key) is not None:
                named[f"{params['name']}.{key}"] = str(params[key])
    return {
        name: dir_fingerprint(resolve_checkpoint(spec, name))
        for name, spec in named.items()
        if spec not in BUILT_IN
    }
