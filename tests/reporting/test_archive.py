"""Archived runs (`repro archive`): a finished run's records.jsonl compressed into records.jsonl.xz, read back
by every reader as before, never resumed by a writer until restored, never losing a byte."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CONFIG, make_record
from conftest import run_cli as cli

from repro.errors import ReproError, RunDirError
from repro.harness.run_kinds import KINDS, load_run, rebuild_report
from repro.reporting.index import _records, run_folders
from repro.reporting.report import DECODE_KIND
from repro.reporting.rundir import RunDir, archive_records, restore_records


def _run(path: Path, prompts: int = 3) -> bytes:
    """A finished decode run of ``prompts`` records at ``path``; its records.jsonl bytes."""
    with RunDir(path, {"config": CONFIG}, DECODE_KIND) as run:
        for i in range(prompts):
            run.append(make_record(prompt_id=f"p{i}"))
        run.write_report()
    return (path / "records.jsonl").read_bytes()


def test_an_archived_run_reads_rebuilds_and_restores_byte_for_byte(tmp_path: Path):
    run = tmp_path / "results" / "run"
    plain = _run(run, prompts=40)
    before, report = load_run(run).records, (run / "report.md").read_text()

    sizes = archive_records(run, KINDS)
    assert sizes is not None and sizes[0] == len(plain) and sizes[1] < len(plain) / 4
    assert not (run / "records.jsonl").exists() and (run / "records.jsonl.xz").is_file()
    assert load_run(run).records == before
    assert rebuild_report(run) == report
    assert run_folders(tmp_path / "results") == [run] and _records(run) == 40
    assert archive_records(run, KINDS) is None  # archived already: left as it is

    assert restore_records(run) is True
    assert (run / "records.jsonl").read_bytes() == plain and not (run / "records.jsonl.xz").exists()
    assert restore_records(run) is False


def test_a_writer_refuses_an_archived_run_until_it_is_restored(tmp_path: Path):
    _run(tmp_path)
    archive_records(tmp_path, KINDS)
    packed = (tmp_path / "records.jsonl.xz").read_bytes()
    with pytest.raises(RunDirError, match=r"holds an archived run .*repro archive --restore"):
        RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    assert (tmp_path / "records.jsonl.xz").read_bytes() == packed
    assert not (tmp_path / "records.jsonl").exists()
    restore_records(tmp_path)
    with RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND) as resumed:  # a resume, as before the archive
        assert resumed.resumed and len(resumed.records()) == 3


def test_an_interrupted_run_is_not_archived(tmp_path: Path):
    _run(tmp_path)
    path = tmp_path / "records.jsonl"
    path.write_bytes(path.read_bytes() + b'{"partial')
    with pytest.warns(UserWarning, match="truncated"), pytest.raises(ReproError, match="interrupted write"):
        archive_records(tmp_path, KINDS)
    assert not (tmp_path / "records.jsonl.xz").exists() and path.read_bytes().endswith(b'{"partial')


def test_a_run_being_written_is_not_archived(tmp_path: Path):
    writer = RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    writer.append(make_record(prompt_id="p0"))
    with pytest.raises(RunDirError, match="another repro process is writing"):
        archive_records(tmp_path, KINDS)
    writer.close()
    assert (tmp_path / "records.jsonl").exists() and not (tmp_path / "records.jsonl.xz").exists()


def test_both_forms_or_a_broken_archive_are_one_clear_error(tmp_path: Path):
    plain = _run(tmp_path)
    archive_records(tmp_path, KINDS)
    (tmp_path / "records.jsonl").write_bytes(plain)
    with pytest.raises(ReproError, match="holds both records.jsonl and records.jsonl.xz"):
        load_run(tmp_path)
    with pytest.raises(ReproError, match="holds both"):
        restore_records(tmp_path)
    (tmp_path / "records.jsonl").unlink()
    (tmp_path / "records.jsonl.xz").write_bytes(b"not xz")
    with pytest.raises(ReproError, match="does not decompress"):
        load_run(tmp_path)


def test_the_command_archives_every_run_of_a_folder_and_restores_them(monkeypatch, capsys, tmp_path: Path):
    results = tmp_path / "results"
    _run(results / "a")
    _run(results / "b" / "c", prompts=2)
    code, out, err = cli(monkeypatch, capsys, "archive", str(results))
    assert code == 0, err
    assert [line.split(":")[0] for line in out.splitlines()] == [str(results / "a"), str(results / "b" / "c")]
    assert all(" -> " in line for line in out.splitlines())
    assert sorted(p.name for p in results.rglob("records.jsonl*")) == ["records.jsonl.xz"] * 2
    code, out, _ = cli(monkeypatch, capsys, "archive", str(results / "a"))
    assert code == 0 and out.strip().endswith("archived already")
    code, out, _ = cli(monkeypatch, capsys, "archive", "--restore", str(results / "b" / "c"))
    assert code == 0 and out.strip().endswith("restored")
    assert (results / "b" / "c" / "records.jsonl").is_file()


@pytest.mark.parametrize("what", ["missing", "empty"])
def test_the_command_names_a_bad_path_in_one_line(monkeypatch, capsys, tmp_path: Path, what: str):
    path = tmp_path / "nothing"
    if what == "empty":
        path.mkdir()
    code, out, err = cli(monkeypatch, capsys, "archive", str(path))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and str(path) in err
