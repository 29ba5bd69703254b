"""scripts/gpu_env.sh, the device scripts' environment: its Triton cache goes back as an archive of what a
cache hit loads and comes back at the same absolute path; an archive over the 16 MiB a returned file may
have is not kept."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def source(checkout: Path, cache: Path, script: str) -> subprocess.CompletedProcess:
    """``script`` run by bash in ``checkout`` after sourcing its scripts/gpu_env.sh (no wheels carried)."""
    env = {**os.environ, "REPRO_TRITON_CACHE": str(cache)}
    return subprocess.run(
        ["bash", "-c", f"source scripts/gpu_env.sh && {script}"],
        cwd=checkout, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip


def checkout_at(tmp_path: Path) -> Path:
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "gpu_env.sh", checkout / "scripts")
    return checkout


def test_the_triton_cache_comes_back_where_it_was_saved(tmp_path: Path):
    checkout, cache = checkout_at(tmp_path), tmp_path / "fixed" / "triton-cache"
    kernel = cache / "KEY"
    grp = f'{{"child_paths": {{"k.cubin": "{kernel}/k.cubin"}}}}'
    fill = " && ".join([
        f"mkdir -p {kernel}", f"echo '{grp}' > {kernel}/__grp__k.json", f"echo '{{}}' > {kernel}/k.json",
        f"echo cubin > {kernel}/k.cubin", f"echo ptx > {kernel}/k.ptx", f"echo so > {kernel}/launcher.so",
        "mkdir -p out", "save_triton_cache out", "echo PYTHONPATH=$PYTHONPATH",
    ])  # fmt: skip
    done = source(checkout, cache, fill)
    assert "Triton cache saved" in done.stdout and f"PYTHONPATH=/tmp/site:{checkout}" in done.stdout
    with tarfile.open(checkout / "out" / "triton-cache.txz") as tar:
        names = sorted(tar.getnames())
    kept = ["__grp__k.json", "k.cubin", "k.json", "launcher.so"]
    assert names == [f"triton-cache/KEY/{n}" for n in kept]  # no IR text
    shutil.rmtree(cache)
    shutil.copy(checkout / "out" / "triton-cache.txz", checkout / ".triton-cache.txz")
    restored = source(checkout, cache, "echo CACHE=$TRITON_CACHE_DIR")
    assert (
        f"CACHE={cache}" in restored.stdout
        and "Triton cache restored (2 files of metadata)" in restored.stdout
    )
    assert sorted(p.name for p in kernel.iterdir()) == kept
    assert (kernel / "k.cubin").read_text() == "cubin\n"


def test_an_archive_over_16_mib_is_not_kept(tmp_path: Path):
    checkout, cache = checkout_at(tmp_path), tmp_path / "triton-cache"
    (cache / "KEY").mkdir(parents=True)
    (cache / "KEY" / "big.cubin").write_bytes(os.urandom(17 * 1024 * 1024))  # incompressible
    done = source(checkout, cache, "mkdir -p out && save_triton_cache out")
    assert "over 16 MiB, not kept" in done.stdout
    assert not (checkout / "out" / "triton-cache.txz").exists()


def test_an_older_gzip_archive_is_restored_too(tmp_path: Path):
    checkout, cache = checkout_at(tmp_path), tmp_path / "fixed" / "triton-cache"
    src = tmp_path / "src" / "triton-cache" / "KEY"
    src.mkdir(parents=True)
    (src / "k.json").write_text("{}")
    (src / "k.cubin").write_text("cubin")
    with tarfile.open(checkout / ".triton-cache.tgz", "w:gz") as tar:
        tar.add(src.parent, arcname="triton-cache")
    restored = source(checkout, cache, "true")
    assert "Triton cache restored (1 files of metadata)" in restored.stdout
    assert (cache / "KEY" / "k.cubin").read_text() == "cubin"


def _cache_archive(path: Path, entries: dict[str, dict[str, bytes]]) -> Path:
    """A cache archive as save_triton_cache writes it: triton-cache/<hash>/<files>, xz."""
    with tarfile.open(path, "w:xz") as tar:
        for folder, files in entries.items():
            for name, data in files.items():
                info = tarfile.TarInfo(f"triton-cache/{folder}/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _triton_cache(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "triton_cache.py"), *args], capture_output=True, text=True
    )


def test_cache_archives_merge_slimmed_and_refuse_to_grow_past_the_cap(tmp_path: Path):
    """scripts/triton_cache.py merge: the entries of every archive (the later one wins on the same entry),
    without the dropped kernels, or only the kept prefixes (launchers always kept); an archive over
    --max-mb is not written and the largest kernels are named."""
    old = _cache_archive(tmp_path / "old.txz", {
        "A": {"__grp___tree_keys_kernel.json": b"{}", "_tree_keys_kernel.cubin": b"old keys"},
        "B": {"_step_kernel.json": b"{}", "_step_kernel.cubin": b"step" * 100},
        "L": {"__triton_launcher.cpython-312.so": b"launcher"},
    })  # fmt: skip
    new = _cache_archive(tmp_path / "new.txz", {
        "C": {"_tree_keys_kernel.json": b"{}", "_tree_keys_kernel.cubin": b"new keys"},
        "B": {"_step_kernel.json": b"{}", "_step_kernel.cubin": b"step2" * 100},
    })  # fmt: skip
    out = tmp_path / "merged.txz"

    def members(path: Path) -> dict[str, bytes]:
        with tarfile.open(path) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}

    done = _triton_cache("merge", str(out), str(old), str(new))
    assert done.returncode == 0, done.stderr
    got = members(out)
    assert {n.split("/")[1] for n in got} == {"A", "B", "C", "L"}
    assert got["triton-cache/B/_step_kernel.cubin"] == b"step2" * 100  # the later archive's entry

    # the kernel's old variants dropped: the ones the new archive brought stay only when given last
    assert _triton_cache("merge", str(out), str(old), "--drop", "_tree_keys_kernel").returncode == 0
    assert {n.split("/")[1] for n in members(out)} == {"B", "L"}
    assert _triton_cache("merge", str(out), str(old), str(new), "--keep", "_tree").returncode == 0
    assert {n.split("/")[1] for n in members(out)} == {"A", "C", "L"}

    listing = _triton_cache("list", str(out))
    assert listing.returncode == 0 and "_tree_keys_kernel" in listing.stdout

    out.unlink()
    refused = _triton_cache("merge", str(out), str(old), str(new), "--max-mb", "0.0001")
    assert refused.returncode == 2 and not out.exists()
    assert "--max-mb" in refused.stderr and "_step_kernel" in refused.stderr
    missing = _triton_cache("merge", str(out), str(tmp_path / "none.txz"))
    assert missing.returncode == 2 and "none.txz is not a file" in missing.stderr
