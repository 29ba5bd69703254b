"""Run directories of every kind: committed results rebuild, INDEX.md, and the defects that lost or
mixed results (two writers, overwrites, the AR baseline, changed checkpoints, edited records, ...)."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import CONFIG, make_record
from conftest import run_cli as cli
from PIL import Image

from repro.errors import ReproError, RunDirError
from repro.harness import falsify
from repro.harness.run_kinds import load_run, rebuild_report
from repro.models.fingerprint import fingerprint_checkpoints
from repro.reporting.index import index_markdown, run_folders
from repro.reporting.records import build_manifest, canonical_json, sha256_ids
from repro.reporting.report import DECODE_KIND, summarize, write_report
from repro.reporting.rundir import DECODE_RECORDS, RunDir, infer_kind

RESULTS = Path(__file__).resolve().parents[2] / "results"


# ------------------------------------------------------------------------- committed results

COMMITTED = run_folders(RESULTS)
FIGURE_SUFFIXES = (".png", ".svg")
LINK = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def _kind_of(folder: Path) -> str:
    return infer_kind(json.loads((folder / "manifest.json").read_text()))


# the first folder of each kind rasterizes its figures; the others' figure files are written empty
# (rasterizing all of them took most of the test's time and tests nothing more: PNG bytes are not
# compared, they depend on the matplotlib version)
_FIRST_OF_KIND = {
    kind: next(f for f in COMMITTED if _kind_of(f) == kind) for kind in set(map(_kind_of, COMMITTED))
}


def test_committed_results_cover_every_kind():
    assert {_kind_of(f) for f in COMMITTED} == {
        "decode", "bench-kernels", "bench-model", "falsify-tree-exactness", "falsify-external",
        "family-report", "paper-table2", "paper-specla", "paper-acceptance", "sweep", "falsify-pool-mass",
        "falsify-what-was-timed", "falsify-uniform-protocol", "bench-scale",
    }  # fmt: skip
    assert len(COMMITTED) >= 100


def _blank_savefig(self: Any, fname: Any, *args: Any, **kwargs: Any) -> None:
    """Figure.savefig standing in: a blank 1 x 1 PNG to a path or a file object, nothing drawn."""
    blank = io.BytesIO()
    Image.new("RGB", (1, 1), "white").save(blank, format="PNG")
    if hasattr(fname, "write"):
        fname.write(blank.getvalue())
    else:
        Path(fname).write_bytes(blank.getvalue())


def _linked_figures(report: str) -> list[str]:
    return [link for link in LINK.findall(report) if not link.startswith(("http://", "https://"))]


@pytest.mark.parametrize("original", COMMITTED, ids=lambda f: str(f.relative_to(RESULTS)))
def test_committed_results_folder_rebuilds(original: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A committed run directory, copied with every output its rebuild writes deleted (report.md, the
    kind's tables, its figures), rebuilds report.md and every table byte for byte as committed; every
    figure the committed report links is in the committed folder, and every figure the rebuilt report
    links was written by the rebuild."""
    from matplotlib.figure import Figure

    rel = original.relative_to(RESULTS)
    folder = tmp_path / "results" / rel
    shutil.copytree(original, folder)
    run = load_run(folder)
    figures = folder / run.manifest.get("figures_dir", "figures")
    for path in [*folder.iterdir(), *(figures.rglob("*") if figures.is_dir() else [])]:
        if path.name in run.kind.outputs or path.suffix in FIGURE_SUFFIXES:
            path.unlink()
    tables = [name for name in run.kind.outputs if name.endswith(".csv")]
    assert not [name for name in ("report.md", *tables) if (folder / name).exists()]

    if _FIRST_OF_KIND[run.kind.name] != original:
        monkeypatch.setattr(Figure, "savefig", _blank_savefig)  # the drawing is checked once per kind
    text = rebuild_report(folder)

    committed = (original / "report.md").read_text()
    assert text.startswith("# ") and (folder / "report.md").read_text() == text
    assert text == committed, f"{rel}/report.md is stale: rebuild it with `repro report results/{rel}`"
    assert str(tmp_path) not in text and str(RESULTS) not in text
    for name in tables:
        assert (folder / name).exists() == (original / name).exists(), (rel, name)
        if (original / name).exists():
            assert (folder / name).read_bytes() == (original / name).read_bytes(), (rel, name)
    for link in _linked_figures(committed):
        assert (original / link).is_file(), f"{rel}/report.md links {link}, not in the committed folder"
        assert (folder / link).is_file(), f"{rel}/report.md links {link}, which its rebuild did not write"


def test_committed_index_is_what_the_command_generates():
    assert (RESULTS / "INDEX.md").read_text() == index_markdown(RESULTS)
    text = index_markdown(RESULTS)
    current = next(line for line in text.splitlines() if line.startswith("| bench-model | "))
    assert "`2026-11-30-h200-model-4`" in current and "`2026-11-30-h200-model-2`" not in current
    assert (
        "`2026-11-30-h200-model-2` | bench-model" in text
        and "superseded by `2026-11-30-h200-model-4`" in text
    )
    assert "`2026-11-30-h200-train-family`: training runs" in text


def test_report_accepts_the_records_file(monkeypatch, capsys, tmp_path: Path):
    run = tmp_path / "run"
    shutil.copytree(RESULTS / "2026-11-30-h200-kernels" / "falsify-tree-exactness-cuda-triton", run)
    code, out, err = cli(monkeypatch, capsys, "report", str(run / "records.jsonl.xz"))  # archived
    assert code == 0, err
    assert out.startswith("# Tree exactness") and (run / "report.md").exists()


def test_decode_records_read_by_default_build_no_report(tmp_path: Path):
    """A decode run read for its records only (load_run's default kind) has no report to build: asking
    for one is one clear error, not a report of some other kind."""
    with RunDir(tmp_path, {"config": CONFIG}, DECODE_RECORDS) as run:
        run.append(make_record(prompt_id="p0"))
        with pytest.raises(RunDirError, match="decode runs read as records only build no report"):
            run.write_report()
    assert [r.prompt_id for r in load_run(tmp_path).records] == ["p0"]  # the decode kind reads them back
    assert "report.md" not in {p.name for p in tmp_path.iterdir()}


# ------------------------------------------------------------------------------ two writers


def test_a_second_writer_is_refused_in_one_line(tmp_path: Path):
    first = RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    first.append(make_record(prompt_id="p0"))
    with pytest.raises(RunDirError, match=rf"another repro process is writing {tmp_path} \(pid \d+\)"):
        RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    first.append(make_record(prompt_id="p1"))
    first.close()
    again = RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)  # the lock is released with the writer
    assert len(again.records()) == 2


def test_a_report_is_not_rebuilt_while_a_writer_holds_the_run(tmp_path: Path):
    """`repro report` writes report.md and tables too: not while the run is being written (its report
    could be of fewer records than the writer's and land after it), and it does when the writer is done."""
    writer = RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    writer.append(make_record(prompt_id="p0"))
    with pytest.raises(RunDirError, match=rf"another repro process is writing {tmp_path} \(pid \d+\)"):
        rebuild_report(tmp_path)
    assert not (tmp_path / "report.md").exists()
    writer.close()
    assert "1 records" in rebuild_report(tmp_path) and (tmp_path / "report.md").is_file()


def test_append_never_truncates_lines_it_did_not_see(tmp_path: Path):
    run = RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    run.append(make_record(prompt_id="p0"))
    path = tmp_path / "records.jsonl"
    path.write_bytes(path.read_bytes() + b'{"partial')  # an interrupted write seen at open
    run.close()
    with pytest.warns(UserWarning, match="truncated"):
        resumed = RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    foreign = make_record(prompt_id="px").to_json().encode()
    with open(path, "ab") as f:  # someone else completes a line behind the writer's back
        f.write(b"\n" + foreign + b"\n")
    before = path.read_bytes()
    with pytest.raises(RunDirError, match="changed while this process was writing it"):
        resumed.append(make_record(prompt_id="p1"))
    assert path.read_bytes() == before


# ------------------------------------------------------------------------------- overwrites


def test_a_foreign_non_empty_directory_is_refused_untouched(monkeypatch, capsys, tmp_path: Path):
    (tmp_path / "report.md").write_text("my notes")
    (tmp_path / "numbers.csv").write_text("a,b\n")
    with pytest.raises(RunDirError, match=r"is not empty \(numbers.csv, report.md\)"):
        RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    code, _, err = cli(monkeypatch, capsys, "falsify", "tree-exactness", "--out", str(tmp_path))
    assert code == 2 and len(err.splitlines()) == 1 and str(tmp_path) in err and "report.md" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["numbers.csv", "report.md"]
    assert (tmp_path / "report.md").read_text() == "my notes"


def test_a_run_of_another_kind_is_refused(tmp_path: Path):
    RunDir(tmp_path, {"config": {"check": "tree-exactness"}}, kind=falsify.KIND).close()
    with pytest.raises(RunDirError, match="holds a falsify-tree-exactness run, not a decode run"):
        RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)


def test_export_default_refuses_an_existing_checkpoint_without_force(monkeypatch, capsys, tmp_path: Path):
    out = tmp_path / "ckpt"
    assert cli(monkeypatch, capsys, "export-default", str(out))[0] == 0
    config = (out / "config.json").read_bytes()
    (out / "model.safetensors").write_bytes(b"mine")
    code, _, err = cli(monkeypatch, capsys, "export-default", str(out), "--seed", "1")
    assert code == 2 and "--force" in err and len(err.splitlines()) == 1
    assert (out / "model.safetensors").read_bytes() == b"mine"
    assert cli(monkeypatch, capsys, "export-default", str(out), "--force")[0] == 0
    assert (out / "model.safetensors").stat().st_size > 1000 and (out / "config.json").read_bytes() == config


# ------------------------------------------------------------------------------ AR baseline


def test_the_baseline_is_the_route_of_kind_ar_not_the_one_named_ar():
    fake = make_record(route="ar", kind="synthetic_chain", accepted=[3], decode_s=0.5)
    real = make_record(route="base", kind="ar", accepted=[1, 1, 1], decode_s=1.0)
    summary = summarize([fake, real]).set_index(["suite", "route"])
    assert summary.loc[("all", "base"), "speedup"] == pytest.approx(1.0)
    assert summary.loc[("all", "ar"), "speedup"] == pytest.approx(2.0)
    assert summary.loc[("all", "base"), "lossless"] == "reference"


# ------------------------------------------------------------------------------- resumption


def test_steps_launched_past_the_end_are_counted_only_when_some_record_has_them():
    import dataclasses

    plain = [make_record(route="ar"), make_record(route="chain", accepted=[2, 1])]
    assert "launched_steps" not in summarize(plain).columns  # old runs rebuild as they were
    ahead = dataclasses.replace(plain[0], launched_steps=9)  # AR's groups ran past a stop
    table = summarize([ahead, plain[1]]).set_index(["suite", "route"])
    assert (
        table.loc[("all", "ar"), "launched_steps"] == 9 and table.loc[("all", "chain"), "launched_steps"] == 2
    )
    with pytest.raises(ValueError, match="launched_steps=1 < steps=3"):
        dataclasses.replace(plain[0], launched_steps=1).validate()


def test_a_changed_checkpoint_is_refused_on_resume(tmp_path: Path, monkeypatch, capsys):
    ckpt = tmp_path / "ckpt"
    assert cli(monkeypatch, capsys, "export-default", str(ckpt))[0] == 0
    cfg = {**CONFIG, "target": str(ckpt), "routes": [{"name": "ar", "kind": "ar"}]}

    def manifest() -> dict:
        return {**build_manifest(cfg), "checkpoints": fingerprint_checkpoints(str(ckpt), cfg["routes"])}

    assert set(manifest()["checkpoints"]["target"]["files"]) >= {"config.json", "model.safetensors"}
    RunDir(tmp_path / "run", manifest(), DECODE_KIND).close()
    RunDir(tmp_path / "run", manifest(), DECODE_KIND).close()
    data = bytearray((ckpt / "model.safetensors").read_bytes())
    data[-1] ^= 1  # same size, one weight bit flipped
    (ckpt / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(
        RunDirError, match=r"other checkpoint contents \(target: .*model\.safetensors changed\)"
    ):
        RunDir(tmp_path / "run", manifest(), DECODE_KIND)


def test_the_same_checkpoint_at_another_path_is_the_same_input(tmp_path: Path):
    """The config hash covers a checkpoint's contents, not its path: a clone or another machine's checkout
    resumes the run (and its shards merge); the path stays in the manifest as information."""
    from repro.models.fingerprint import dir_fingerprint

    here, there = tmp_path / "a" / "ckpt", tmp_path / "b" / "ckpt"
    here.mkdir(parents=True)
    (here / "config.json").write_text('{"layers": 2}')
    (here / "model.safetensors").write_bytes(bytes(range(256)))
    shutil.copytree(here, there)

    def manifest(ckpt: Path) -> dict:
        return {"config": CONFIG, "checkpoints": {"target": dir_fingerprint(ckpt)}}

    with RunDir(tmp_path / "run", manifest(here), DECODE_KIND) as run:
        run.append(make_record(prompt_id="p0"))
    with RunDir(tmp_path / "run", manifest(there), DECODE_KIND) as run:
        assert run.resumed and run.manifest["checkpoints"]["target"]["path"] == str(here)
    (there / "config.json").write_text('{"layers": 3}')
    with pytest.raises(
        RunDirError, match=r"other checkpoint contents \(target: .*b/ckpt/config.json changed"
    ):
        RunDir(tmp_path / "run", manifest(there), DECODE_KIND)


def test_a_manifest_edited_by_hand_is_refused(tmp_path: Path):
    """A manifest's config_hash must be the hash of its own config and checkpoints: an edited config (or
    hash) is refused on resume, untouched."""
    with RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND) as run:
        run.append(make_record())
    original = json.loads((tmp_path / "manifest.json").read_text())
    for edit in ({"config": {**CONFIG, "max_new_tokens": 64}}, {"config_hash": "0" * 64}):
        text = json.dumps({**original, **edit})
        (tmp_path / "manifest.json").write_text(text)
        with pytest.raises(RunDirError, match="whose config_hash .* is not the hash of its config"):
            RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
        assert (tmp_path / "manifest.json").read_text() == text
    legacy = {"target": {"path": "/old/checkout/ckpt", "files": {"a": {"size": 1, "sha256": "x"}}}}
    written = {**original, "checkpoints": legacy}  # written when the hash still covered the path
    written["config_hash"] = hashlib.sha256(
        canonical_json({"config": CONFIG, "checkpoints": legacy}).encode()
    ).hexdigest()
    (tmp_path / "manifest.json").write_text(json.dumps(written))
    with RunDir(tmp_path, {"config": CONFIG, "checkpoints": legacy}, DECODE_KIND) as run:
        assert run.resumed


def test_family_names_are_fingerprinted_and_built_in_models_are_not():
    from repro.models.family import FAMILY_DIR

    routes = [{"name": "d", "kind": "dflash_chain", "drafter": "tiny-qwen35-dflash"}]
    prints = fingerprint_checkpoints("default", routes)
    assert set(prints) == {"target", "d.drafter"}
    assert prints["target"]["path"] == str(FAMILY_DIR / "tiny-qwen35")
    assert len(prints["d.drafter"]["files"]["config.json"]["sha256"]) == 64
    assert fingerprint_checkpoints("tiny-random", [{"name": "r", "drafter": "random"}]) == {}


def test_a_route_s_default_drafter_is_fingerprinted(monkeypatch, capsys, tmp_path: Path):
    """A route that names no drafter decodes with its target family's own: that checkpoint is in the
    manifest's fingerprints, so a resume after it changed is refused."""
    routes = "routes=[{name: ar, kind: ar}, {name: d, kind: dflash_chain}]"
    args = ("run", "smoke", "--suites", "gsm8k", "--limit", "1", "--max-new-tokens", "4", "--set", routes)
    code, _, err = cli(monkeypatch, capsys, *args, "--out", str(tmp_path / "run"))
    assert code == 0, err
    prints = json.loads((tmp_path / "run" / "manifest.json").read_text())["checkpoints"]
    assert set(prints) == {"target", "d.drafter"} and prints["d.drafter"]["path"].endswith(
        "tiny-qwen35-dflash"
    )


def test_large_files_are_hashed_whole_once_per_version(tmp_path: Path, monkeypatch):
    """Over the cache threshold a file is still hashed whole (two checkpoints of one shape and header
    differ), and the hash is read back from the cache until the file changes."""
    from repro.models import fingerprint as fp

    monkeypatch.setattr(fp, "CACHED_ABOVE", 1024)
    monkeypatch.setenv("REPRO_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"h" * 64 + bytes(4096))
    hashed = []
    monkeypatch.setattr(fp, "_sha256", lambda p, real=fp._sha256: hashed.append(p) or real(p))
    first = fp.file_fingerprint(path)
    assert fp.file_fingerprint(path) == first and len(hashed) == 1  # second call: from the cache
    path.write_bytes(b"h" * 64 + bytes(4095) + b"\x01")  # same size, same header, last byte differs
    second = fp.file_fingerprint(path)
    assert second["size"] == first["size"] and second["sha256"] != first["sha256"] and len(hashed) == 2
    assert (
        json.loads((tmp_path / "cache" / "fingerprints.json").read_text())[str(path.resolve())]["sha256"]
        == second["sha256"]
    )


def test_a_truncated_records_line_is_one_warning_line_and_the_resume_completes(monkeypatch, capsys, tmp_path):
    only_ar = "routes=[{name: ar, kind: ar}]"
    args = ("run", "smoke", "--suites", "gsm8k", "--limit", "2", "--max-new-tokens", "3", "--set", only_ar)
    out = ("--out", str(tmp_path / "run"))
    assert cli(monkeypatch, capsys, *args, *out)[0] == 0
    records = tmp_path / "run" / "records.jsonl"
    whole = records.read_bytes()
    records.write_bytes(whole[: whole.rfind(b"\n", 0, len(whole) - 1) + 40])  # killed writing the last line
    code, _, err = cli(monkeypatch, capsys, *args, *out)
    assert code == 0
    assert err.splitlines()[0].startswith("warning: ") and "truncated last line" in err.splitlines()[0]
    assert err.count("truncated last line") == 1 and "warnings.warn" not in err, err
    assert records.read_bytes().count(b"\n") == whole.count(b"\n") == 2


def test_a_resume_with_changed_suite_contents_is_refused(monkeypatch, capsys, tmp_path: Path):
    from repro.data.suites import suites_dir

    copy = tmp_path / "suites"
    shutil.copytree(suites_dir(), copy)
    monkeypatch.setenv("REPRO_SUITES_DIR", str(copy))
    only_ar = "routes=[{name: ar, kind: ar}]"
    args = ("run", "smoke", "--suites", "gsm8k", "--limit", "1", "--max-new-tokens", "3", "--set", only_ar)
    out = ("--out", str(tmp_path / "run"))
    assert cli(monkeypatch, capsys, *args, *out)[0] == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert (
        manifest["suites"]["gsm8k"]["sha256"]
        == json.loads((copy / "manifest.json").read_text())["suites"]["gsm8k"]["sha256"]
    )
    file = copy / "gsm8k.jsonl"  # one prompt rewritten, the suite manifest updated to match
    lines = file.read_text().splitlines()
    first = json.loads(lines[0])
    lines[0] = json.dumps({**first, "turns": ["What is 2 + 2?"]})
    file.write_text("\n".join(lines) + "\n")
    suites = json.loads((copy / "manifest.json").read_text())
    suites["suites"]["gsm8k"]["sha256"] = hashlib.sha256(file.read_bytes()).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(suites))
    code, _, err = cli(monkeypatch, capsys, *args, *out)
    assert code == 2 and "was run with other prompt suite contents (gsm8k: sha256" in err


def test_a_resume_by_other_code_is_refused_unless_asked(tmp_path: Path, monkeypatch):
    """Records of two git shas are not mixed silently: refused, or with REPRO_RESUME_ACROSS_CODE=1 mixed
    and every sha named in the report's header."""
    monkeypatch.setenv("REPRO_GIT_SHA", "aaaa1111")
    with RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND) as run:
        run.append(make_record(prompt_id="p0"))
    monkeypatch.setenv("REPRO_GIT_SHA", "bbbb2222")
    with pytest.raises(RunDirError) as exc:
        RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    assert "was written by git sha aaaa1111, this is bbbb2222" in str(exc.value)
    monkeypatch.setenv("REPRO_RESUME_ACROSS_CODE", "1")
    with RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND) as run:
        run.append(make_record(prompt_id="p1"))
        text = run.write_report()
    assert "- git sha: aaaa1111 (resumed with bbbb2222)" in text


def test_a_merge_of_shards_of_other_code_names_every_sha_in_the_header(tmp_path: Path, monkeypatch):
    """Shards merged with REPRO_RESUME_ACROSS_CODE=1 (repro.harness.parallel.merge_shards) mix two code
    versions as a resume across code does: the merged run's header names every shard's sha, not only the
    first shard's that its manifest inherits (the shards' provenance keeps each)."""
    monkeypatch.setenv("REPRO_GIT_SHA", "aaaa1111")
    with RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND) as run:
        run.append(make_record(prompt_id="p0"))
        run.append(make_record(prompt_id="p1"))
        shards = {
            "rank-0": {"shard": "0/2", "git_sha": "aaaa1111"},
            "rank-1": {"shard": "1/2", "git_sha": "cccc3333"},
        }
        run.update_manifest(shards=shards)
        text = run.write_report()
        assert "- git sha: aaaa1111 (shards also by cccc3333)" in text
        run.update_manifest(shards={**shards, "rank-1": {"shard": "1/2", "git_sha": "aaaa1111"}})
        assert "- git sha: aaaa1111\n" in run.write_report()  # one code version: nothing more to say


def test_bad_record_fields_are_one_line(monkeypatch, capsys, tmp_path: Path):
    with RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND) as run:
        run.append(make_record())
    good = (tmp_path / "records.jsonl").read_text()
    for field, value in (("route_params", []), ("prompt_id", [1]), ("route", None), ("prompt_tokens", "x")):
        record = {**json.loads(good), field: value}
        (tmp_path / "records.jsonl").write_text(json.dumps(record) + "\n")
        code, _, err = cli(monkeypatch, capsys, "report", str(tmp_path))
        assert code == 2 and len(err.splitlines()) == 1 and "line 1 is not a valid record" in err, (
            field,
            err,
        )
        assert field in err or "unhashable" in err, err


def test_figures_outside_the_run_never_overwrite_foreign_files(tmp_path: Path):
    with RunDir(tmp_path / "a", {"config": CONFIG}, DECODE_KIND) as run:
        run.append(make_record())
    mine = tmp_path / "figs"
    mine.mkdir()
    (mine / "accept_histogram.png").write_text("a precious figure")
    with pytest.raises(RunDirError, match="holds files this run did not write"):
        rebuild_report(tmp_path / "a", figures=mine)
    assert (mine / "accept_histogram.png").read_text() == "a precious figure"
    rebuild_report(tmp_path / "a", figures=tmp_path / "shared")  # claimed by run a
    rebuild_report(tmp_path / "a", figures=tmp_path / "shared")  # a rebuild of run a may write again
    with RunDir(tmp_path / "b", {"config": CONFIG}, DECODE_KIND) as run:
        run.append(make_record())
    with pytest.raises(RunDirError, match="belongs to the run"):
        rebuild_report(tmp_path / "b", figures=tmp_path / "shared")


TINY = {
    "name": "t", "target": "tiny-random", "dtype": "float64", "suites": ["gsm8k"], "limit": 1,
    "max_new_tokens": 4, "warmup": 0, "ignore_eos": True,
    "routes": [{"name": "ar", "kind": "ar"}, {"name": "c", "kind": "synthetic_chain", "k": 2, "p": 0.5}],
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[dict, Path]:
    """The resolved tiny experiment and a complete run directory of it (tests resume copies of it)."""
    from repro.harness.experiment import resolve
    from repro.harness.runner import ExperimentRunner

    cfg = resolve(TINY, {})
    path = tmp_path_factory.mktemp("tiny") / "run"
    runner = ExperimentRunner(cfg)
    with RunDir(path, build_manifest(cfg), DECODE_KIND, runner.check_resumed) as run:
        assert runner.run(run) == 2
    return cfg, path


def edited_copy(tiny_run: tuple[dict, Path], tmp_path: Path, line: int, edit) -> Path:
    """A copy of the tiny run whose record on ``line`` (1-based) is ``edit(record dict)``, still valid."""
    path = tmp_path / "run"
    shutil.copytree(tiny_run[1], path)
    records = path / "records.jsonl"
    lines = records.read_text().splitlines()
    record = json.loads(lines[line - 1])
    edit(record)
    lines[line - 1] = json.dumps(record)
    records.write_text("\n".join(lines) + "\n")
    return path


def refused_untouched(cfg: dict, path: Path, match: str) -> None:
    """Resuming ``path`` with ``cfg`` as the CLI does is refused in one line, and writes nothing."""
    from repro.harness.runner import ExperimentRunner

    before = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file() and p.name != ".lock"}
    runner = ExperimentRunner(cfg)
    with pytest.raises(RunDirError, match=match) as exc:
        RunDir(path, build_manifest(cfg), DECODE_KIND, runner.check_resumed)
    assert len(str(exc.value).splitlines()) == 1
    assert {p.name: p.read_bytes() for p in path.iterdir() if p.is_file() and p.name != ".lock"} == before


def longer(record: dict) -> None:
    """One more AR token than the record had."""
    record["output_ids"].append(5)
    record["new_tokens"] += 1
    record["steps"] += 1
    record["accepted_lengths"].append(1)
    record["tree_sizes"].append(record["tree_sizes"][-1] if record["tree_sizes"] else 1)
    record["output_sha256"] = sha256_ids(record["output_ids"])


@pytest.mark.parametrize(
    ("line", "edit", "match"),
    [
        (2, lambda r: r["route_params"].update(kind="synthetic_tree"), r"line 2: route 'c' has route_params"),
        (2, lambda r: r.update(route="gone"), r"line 2: route 'gone' is not in this run's config"),
        (
            1,
            lambda r: r.update(prompt_id="elsewhere"),
            r"line 1: gsm8k/elsewhere turn 0 is not one of this run",
        ),
        (1, lambda r: r.update(turn=1), r"line 1: gsm8k/.* turn 1 is not one of this run's prompts"),
        (2, lambda r: r.update(seed=r["seed"] + 1), r"line 2: seed \d+ is not this run's"),
        (1, lambda r: r.update(temperature=0.7), r"line 1: temperature 0.7 is not this run's"),
        (1, longer, r"line 1: new_tokens 5 exceeds this run's max_new_tokens 4"),
        (
            2,
            lambda r: r.update(prompt_sha256="0" * 64),
            r"line 2: the record of gsm8k/.* turn 0 c was decoded",
        ),
    ],
)
def test_a_record_of_another_configuration_is_refused_before_writing(tiny_run, tmp_path, line, edit, match):
    """A resume accepts only records this configuration writes: its routes with their resolved
    parameters, its prompts and turns, its seed and temperature, at most max_new_tokens; anything else is
    one line naming the record's line, and the directory is left as it was."""
    cfg, _ = tiny_run
    refused_untouched(
        cfg, edited_copy(tiny_run, tmp_path, line, edit), f"cannot be resumed: records.jsonl {match}"
    )


def test_a_corrupt_manifest_says_the_records_are_intact(tmp_path: Path):
    with RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND) as run:
        run.append(make_record())
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(RunDirError) as exc:
        RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    msg = str(exc.value)
    assert "not valid JSON" in msg and "records.jsonl is untouched" in msg and "restore" in msg
    assert "delete" not in msg


# ---------------------------------------------------------------------------- file systems


def test_a_full_file_system_is_one_line(tmp_path: Path, monkeypatch):
    run = RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("repro.reporting.rundir.os.fsync", full)
    with pytest.raises(RunDirError, match=r"cannot write .*records.jsonl: No space left on device"):
        run.append(make_record())


def test_a_read_only_output_is_one_line(monkeypatch, capsys, tmp_path: Path):
    def read_only(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(Path, "mkdir", read_only)
    out = tmp_path / "out"
    code, _, err = cli(monkeypatch, capsys, "falsify", "tree-exactness", "--out", str(out))
    assert code == 2 and err.endswith(f"cannot write {out}: Read-only file system")
    assert len(err.splitlines()) == 1


# ----------------------------------------------------------------------- reports still written


def test_a_run_without_verify_steps_still_gets_its_report(tmp_path: Path):
    with RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND) as run:
        for route in ("ar", "chain"):
            run.append(make_record(route=route, accepted=[]))  # stopped after the prefill token
    text = write_report(tmp_path)
    assert "Figures skipped: no verify steps" in text and (tmp_path / "report.md").exists()
    assert not (tmp_path / "accept_histogram.png").exists()
    assert len(pd.read_csv(tmp_path / "summary.csv")) == 4


def test_outputs_are_listed_in_the_manifest(tmp_path: Path):
    with RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND) as run:
        run.append(make_record())
        run.write_report()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["kind"] == "decode"
    assert {"report.md", "summary.csv", "histogram.csv", "accept_histogram.png"} <= set(manifest["outputs"])
    with pytest.raises(ReproError, match="not a run directory"):
        load_run(tmp_path / "report.md")


def test_a_resume_on_another_device_class_is_refused(tmp_path: Path, monkeypatch):
    """A run measured on one GPU model is not resumed on another (H200 timings beside H100 ones)."""
    from repro.reporting import records

    cuda_cfg = {**CONFIG, "device": "cuda"}
    h200 = {"cpu": "x86", "cuda": "NVIDIA H200 x8", "torch_threads": 1, "description": "NVIDIA H200 x8"}
    monkeypatch.setattr(records, "device_info", lambda: dict(h200))
    with RunDir(tmp_path, {"config": cuda_cfg}, DECODE_KIND) as run:
        run.append(make_record(prompt_id="p0"))
    assert json.loads((tmp_path / "manifest.json").read_text())["device_class"] == "NVIDIA H200"
    with RunDir(tmp_path, {"config": cuda_cfg}, DECODE_KIND) as run:  # same class (one GPU or eight): resumes
        assert run.resumed
    h100 = {**h200, "cuda": "NVIDIA H100 80GB HBM3", "description": "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(records, "device_info", lambda: dict(h100))
    with pytest.raises(RunDirError) as exc:
        RunDir(tmp_path, {"config": cuda_cfg}, DECODE_KIND)
    assert "was measured on NVIDIA H200, this machine is NVIDIA H100 80GB HBM3" in str(exc.value)
    assert len(str(exc.value).splitlines()) == 1
    manifest = json.loads((tmp_path / "manifest.json").read_text())  # older manifests: from device_info
    del manifest["device_class"]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RunDirError, match="was measured on NVIDIA H200"):
        RunDir(tmp_path, {"config": cuda_cfg}, DECODE_KIND)


def test_cpu_runs_share_one_device_class():
    from repro.reporting.records import device_class

    gpu = {"cuda": "NVIDIA H200", "cpu": "x86"}
    assert device_class(gpu, {"device": "cpu"}) == "cpu" == device_class({"cuda": None, "cpu": "arm"})
    assert device_class(gpu, {"device": "cuda"}) == "NVIDIA H200" == device_class(gpu, {})


def test_the_manifest_records_the_repro_switches_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Kernel switches (REPRO_PDL, REPRO_VERIFY_ROWS, ...) change what a run times: the manifest names
    every REPRO_* variable set, and no other; the report's header shows them."""
    for key in [k for k in os.environ if k.startswith("REPRO_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("REPRO_VERIFY_ROWS", "gemv")
    monkeypatch.setenv("REPRO_PDL", "0")
    monkeypatch.setenv("NOT_REPRO_X", "1")
    manifest = build_manifest({"seed": 1})
    assert manifest["repro_env"] == {"REPRO_PDL": "0", "REPRO_VERIFY_ROWS": "gemv"}
    with RunDir(tmp_path, manifest, DECODE_KIND) as run:
        run.append(make_record())
    text = rebuild_report(tmp_path, figures=None)
    assert "- REPRO_* switches set: REPRO_PDL=0, REPRO_VERIFY_ROWS=gemv" in text
    monkeypatch.delenv("REPRO_VERIFY_ROWS")
    monkeypatch.delenv("REPRO_PDL")
    assert build_manifest({"seed": 1})["repro_env"] == {}


def test_a_resume_under_other_kernel_switches_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Each session's REPRO_* variables are kept in its resumes entry; a resume under another kernel switch
    (set, unset or changed) is refused in one line naming it, and variables that are not switches (the
    git sha, cache paths) do not count."""
    for key in [k for k in os.environ if k.startswith("REPRO_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("REPRO_PDL", "0")
    monkeypatch.setenv("REPRO_GIT_SHA", "abc")
    with RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND) as run:
        run.append(make_record(prompt_id="p0"))
    monkeypatch.setenv("REPRO_TRITON_CACHE", "/elsewhere")
    with RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND) as run:
        assert run.manifest["resumes"][-1]["repro_env"]["REPRO_PDL"] == "0"
    before = (tmp_path / "manifest.json").read_text()
    monkeypatch.setenv("REPRO_PDL", "1")
    monkeypatch.setenv("REPRO_VERIFY_ROWS", "gemv")
    with pytest.raises(RunDirError) as exc:
        RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    assert "other kernel switches (REPRO_PDL=0 -> 1, REPRO_VERIFY_ROWS=unset -> gemv;" in str(exc.value)
    assert len(str(exc.value).splitlines()) == 1
    assert (tmp_path / "manifest.json").read_text() == before


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ({"config_hash": 5}, "config_hash is int, not str"),
        ({"resumes": {}}, "resumes is dict, not list"),
        ({"resumes": [1]}, "resumes holds an entry that is not an object"),
        ({"outputs": None}, "outputs is NoneType, not list"),
        ({"config": None}, "config is NoneType, not dict"),
        ({"kind": ["decode"]}, "kind is list, not str"),
    ],
)
def test_a_malformed_manifest_is_one_line(monkeypatch, capsys, tmp_path: Path, edit: dict, why: str):
    """A manifest with an entry of the wrong JSON type is one line (exit 2) for a resume and a report, not
    a traceback, and is left as it was."""
    with RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND) as run:
        run.append(make_record())
    text = json.dumps({**json.loads((tmp_path / "manifest.json").read_text()), **edit})
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(RunDirError, match=f"is not a run manifest \\({why}\\)"):
        RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    code, _, err = cli(monkeypatch, capsys, "report", str(tmp_path))
    assert code == 2 and len(err.splitlines()) == 1 and why in err
    assert (tmp_path / "manifest.json").read_text() == text


def test_refusals_name_file_lines_say_what_is_held_and_leave_no_lock(tiny_run, tmp_path: Path):
    """A refused record is named by its line in the file (blank lines counted); a run without records is
    'a run' of another configuration, not 'records'; a foreign manifest is refused before the lock file is
    made."""
    cfg, _ = tiny_run
    path = edited_copy(tiny_run, tmp_path, 2, lambda r: r.update(seed=r["seed"] + 1))
    records = path / "records.jsonl"
    records.write_text("\n" + records.read_text())
    refused_untouched(cfg, path, r"records.jsonl line 3: seed")
    empty = tmp_path / "empty"
    RunDir(empty, {"config": CONFIG}, DECODE_KIND).close()
    with pytest.raises(RunDirError, match="holds a run of a different configuration"):
        RunDir(empty, {"config": {**CONFIG, "max_new_tokens": 8}}, DECODE_KIND)
    foreign = tmp_path / "foreign"
    RunDir(foreign, {"config": {"check": "tree-exactness"}}, kind=falsify.KIND).close()
    (foreign / ".lock").unlink()
    with pytest.raises(RunDirError, match="holds a falsify-tree-exactness run"):
        RunDir(foreign, {"config": CONFIG}, DECODE_KIND)
    assert not (foreign / ".lock").exists()
