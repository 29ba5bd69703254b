"""The tracked tree stays small enough to travel: every GPU call carries it, with the wheels and the call
script, and a tree over 64 MiB is refused there (docs/gpu.md). Committed results grow every session."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the GPU machine's 64 MiB, less what travels beside the tree: the fla wheels (1.5 MB), the Triton cache
# (.triton-cache.txz, ~8 MB: it saves ~140 s of compiles a call) and the call script
MAX_TRACKED_BYTES = 54 << 20


def tracked_bytes() -> tuple[int, list[tuple[int, str]]]:
    """The bytes of every file git tracks here, and the ten largest (bytes, path)."""
    names = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    sizes = [((ROOT / n).stat().st_size, n) for n in names if n and (ROOT / n).is_file()]
    return sum(s for s, _ in sizes), sorted(sizes, reverse=True)[:10]


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)
def test_the_tracked_tree_fits_a_gpu_call_with_room_to_spare():
    total, largest = tracked_bytes()
    assert total <= MAX_TRACKED_BYTES, (
        f"tracked files {total / 2**20:.1f} MiB > {MAX_TRACKED_BYTES >> 20} MiB: a GPU call would soon be "
        f"refused; trim or compress results (largest: {largest})"
    )


LOG_SUFFIXES = (".log", ".txt", ".xml")  # device calls' logs, test outputs and junit files
MAX_PLAIN_LOG_BYTES = 4096


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)
def test_committed_logs_are_compressed():
    """Logs under results/ are committed as NAME.xz (`xz -9 NAME`; read with `xz -dc`): uncompressed they
    were 4.5 of the tree's 53.5 MiB on 2026-12-05, 1.3 MiB once compressed."""
    names = (
        subprocess.run(["git", "ls-files", "-z", "results"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    logs = [ROOT / n for n in names if n.endswith(LOG_SUFFIXES)]
    plain = [str(p.relative_to(ROOT)) for p in logs if p.is_file() and p.stat().st_size > MAX_PLAIN_LOG_BYTES]
    assert not plain, f"compress these logs with `xz -9` (and name NAME.xz in the NOTES): {plain[:5]}"


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)
def test_committed_runs_are_archived():
    """Run directories under results/ are committed archived (`repro archive DIR`: records.jsonl.xz, read
    by every command): their plain records were 11.0 of the tree's 52.9 MiB on 2026-12-06, 1.1 archived."""
    names = (
        subprocess.run(["git", "ls-files", "-z", "results"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    plain = [
        str(Path(n).parent)
        for n in names
        if n.endswith("/records.jsonl")
        and (ROOT / n).is_file()
        and (ROOT / n).stat().st_size > MAX_PLAIN_LOG_BYTES
    ]
    assert not plain, f"archive these runs before committing them: repro archive {' '.join(plain[:5])}"
