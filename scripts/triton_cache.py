"""Merge, slim and list the Triton caches that device calls bring back (``$OUT/triton-cache.txz``, saved by
``save_triton_cache`` in scripts/gpu_env.sh), for the checkout's carried ``.triton-cache.txz``.

Every call carries the tracked tree, the wheels and that archive under the device's 64 MiB, so the cache
must stay small: a call that compiled only the tree kernels brings back a cache of those alone, and the
kernels of an edited source stay in it as dead entries (a changed kernel misses the cache; its old
variants are never read again). Usage:

    python3 scripts/triton_cache.py list A.txz                       # uncompressed bytes, variants per kernel
    python3 scripts/triton_cache.py merge OUT.txz A.txz B.txz ...    # later archives win on the same entry
        [--drop NAME,...]    # leave out these kernels' entries (those of a source changed since)
        [--keep PREFIX,...]  # only kernels whose names start so (launchers are always kept)
        [--max-mb 12]        # refuse to write a larger archive (names the largest kernels)

An entry is one folder of the cache (``triton-cache/<hash>/``: a kernel variant's metadata, cubin and
group file, or a built launcher); its kernel is the name of its files.
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

LAUNCHER = "__triton_launcher"  # the built launchers' entries: shared by every kernel, always kept


def read_entries(archive: Path) -> dict[str, dict[str, bytes]]:
    """{entry folder (``triton-cache/<hash>``): {file name: bytes}} of one cache archive (xz or gzip)."""
    entries: dict[str, dict[str, bytes]] = defaultdict(dict)
    with tarfile.open(archive, "r:*") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            folder, _, name = member.name.rpartition("/")
            data = tar.extractfile(member)
            assert data is not None
            entries[folder][name] = data.read()
    return dict(entries)


def kernel_of(files: dict[str, bytes]) -> str:
    """The kernel an entry belongs to: the stem of its files (not the ``__grp__`` group file)."""
    names = sorted(n for n in files if not n.startswith("__grp__")) or sorted(files)
    return names[0].split(".")[0] if names else ""


def select(
    entries: dict[str, dict[str, bytes]], drop: set[str], keep: tuple[str, ...]
) -> dict[str, dict[str, bytes]]:
    """The entries whose kernel is not in ``drop`` and, with ``keep``, starts with one of its prefixes
    (launchers always)."""
    out = {}
    for folder, files in entries.items():
        kernel = kernel_of(files)
        if kernel.startswith(LAUNCHER) or (kernel not in drop and (not keep or kernel.startswith(keep))):
            out[folder] = files
    return out


def write_archive(entries: dict[str, dict[str, bytes]], out: Path) -> int:
    """Write ``entries`` as an xz tar (sorted, so the same entries give the same archive); its bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for folder in sorted(entries):
            for name in sorted(entries[folder]):
                data = entries[folder][name]
                info = tarfile.TarInfo(f"{folder}/{name}")
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    out.write_bytes(buf.getvalue())
    return len(buf.getvalue())


def by_kernel(entries: dict[str, dict[str, bytes]]) -> list[tuple[str, int, int]]:
    """(kernel, variants, bytes) per kernel, largest first."""
    sizes: dict[str, list[int]] = defaultdict(list)
    for files in entries.values():
        sizes[kernel_of(files)].append(sum(map(len, files.values())))
    return sorted(((k, len(v), sum(v)) for k, v in sizes.items()), key=lambda r: -r[2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    lister = sub.add_parser("list", help="bytes and variants per kernel")
    lister.add_argument("archive", type=Path)
    merger = sub.add_parser("merge", help="merge archives into one, slimmed")
    merger.add_argument("out", type=Path)
    merger.add_argument("archives", type=Path, nargs="+")
    merger.add_argument("--drop", default="", help="kernel names to leave out, comma-separated")
    merger.add_argument("--keep", default="", help="kernel name prefixes to keep alone, comma-separated")
    merger.add_argument("--max-mb", type=float, default=12.0, help="the largest archive to write (MB)")
    args = parser.parse_args(argv)
    for path in [args.archive] if args.command == "list" else args.archives:
        if not path.is_file():
            print(f"triton_cache: {path} is not a file", file=sys.stderr)
            return 2
    if args.command == "list":
        for kernel, variants, size in by_kernel(read_entries(args.archive)):
            print(f"{size / 1e6:8.2f} MB uncompressed {variants:4d} variants  {kernel}")
        return 0
    entries: dict[str, dict[str, bytes]] = {}
    for path in args.archives:
        entries.update(read_entries(path))
    drop = {n for n in args.drop.split(",") if n}
    keep = tuple(p for p in args.keep.split(",") if p)
    chosen = select(entries, drop, keep)
    size = write_archive(chosen, args.out)
    if size > args.max_mb * 1e6:
        args.out.unlink()
        largest = ", ".join(f"{k} {s / 1e6:.1f} MB" for k, _, s in by_kernel(chosen)[:5])
        print(f"triton_cache: {size / 1e6:.1f} MB > --max-mb {args.max_mb:g}; drop some of: {largest}",
              file=sys.stderr)  # fmt: skip
        return 2
    print(f"{args.out}: {len(chosen)} of {len(entries)} entries, {size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
