"""``repro suites verify``: a file that is missing or does not match the manifest is a failed check
(exit 3); a suite that cannot be checked (unusable manifest or entry, unreadable file) is bad input
(exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli as cli

from repro.data import suites

REPO_SUITES = Path(suites.__file__).resolve().parents[2] / "suites"


@pytest.fixture
def copy(tmp_path, monkeypatch) -> Path:
    """A writable copy of the committed suites folder, made current through REPRO_SUITES_DIR."""
    folder = tmp_path / "suites"
    shutil.copytree(REPO_SUITES, folder)
    monkeypatch.setenv("REPRO_SUITES_DIR", str(folder))
    return folder


def _unreadable(monkeypatch, name: str) -> None:
    """Reading the file ``name`` fails as a file without read permission does (tests run as root)."""
    read = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.name == name:
            raise PermissionError(13, "Permission denied", str(self))
        return read(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)


def _edit_manifest(folder: Path, edit) -> None:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text("utf-8"))
    edit(manifest["suites"])
    path.write_text(json.dumps(manifest), "utf-8")


def test_a_corrupted_file_is_a_failed_check(monkeypatch, capsys, copy):
    data = bytearray((copy / "gsm8k.jsonl").read_bytes())
    data[100] ^= 1
    (copy / "gsm8k.jsonl").write_bytes(bytes(data))
    code, out, err = cli(monkeypatch, capsys, "suites", "verify")
    assert code == 3
    assert "BAD gsm8k: suite file" in out and "corrupted" in out and "ok  humaneval: 164 records" in out
    assert err.splitlines() == [f"error: 1 suite file(s) do not match {copy / 'manifest.json'} (gsm8k)"]


def test_a_missing_file_or_a_wrong_record_count_is_a_failed_check(monkeypatch, capsys, copy):
    (copy / "humaneval.jsonl").unlink()
    _edit_manifest(copy, lambda s: s["mt_bench"].update(records=81))
    code, out, err = cli(monkeypatch, capsys, "suites", "verify")
    assert code == 3 and "humaneval.jsonl is missing" in out and "record count differs" in out
    assert (
        len(err.splitlines()) == 1 and "2 suite file(s) do not match" in err and "mt_bench, humaneval" in err
    )


def test_a_suite_that_cannot_be_checked_is_bad_input(monkeypatch, capsys, copy):
    _unreadable(monkeypatch, "gsm8k.jsonl")
    _edit_manifest(copy, lambda s: s.pop("humaneval"))
    code, out, err = cli(monkeypatch, capsys, "suites", "verify")
    assert code == 2 and "ok  mt_bench" in out
    assert "BAD gsm8k: cannot read suite file" in out and "Permission denied" in out
    assert "BAD humaneval: suite manifest" in out and "has no entry for humaneval" in out
    assert err.splitlines() == [
        f"error: 2 suite file(s) could not be checked against {copy / 'manifest.json'} (gsm8k, humaneval)"
    ]
    (copy / "manifest.json").write_text("{not json", "utf-8")
    code, out, err = cli(monkeypatch, capsys, "suites", "verify")
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "is not valid JSON" in err


def test_a_mismatch_beside_an_unreadable_file_is_still_a_failed_check(monkeypatch, capsys, copy):
    (copy / "mt_bench.jsonl").write_bytes(b"{}\n")
    _unreadable(monkeypatch, "gsm8k.jsonl")
    code, out, err = cli(monkeypatch, capsys, "suites", "verify")
    assert code == 3 and "BAD mt_bench" in out and "BAD gsm8k" in out
    assert err.endswith("(mt_bench); gsm8k could not be checked") and len(err.splitlines()) == 1
