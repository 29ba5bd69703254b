"""Records, run directories (append, interrupted runs, resume, refusal) and hashing."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import CONFIG, make_record

from repro.errors import ReproError, RunDirError
from repro.reporting.records import (
    DecodeRecord,
    RecordsWarning,
    canonical_json,
    compare_to_reference,
    config_hash,
    git_sha,
    sha256_ids,
)
from repro.reporting.report import DECODE_KIND
from repro.reporting.rundir import RunDir, load_records

# ------------------------------------------------------------------------------------ hashing


def test_sha256_ids_hashes_comma_joined_ids():
    assert sha256_ids([1, 2, 3]) == hashlib.sha256(b"1,2,3").hexdigest()
    assert sha256_ids([]) == hashlib.sha256(b"").hexdigest()
    assert sha256_ids([1, 23]) != sha256_ids([12, 3])


@pytest.mark.parametrize(
    ("ids", "ref", "expected"),
    [
        ([5, 6, 7], [5, 6, 7], "identical"),
        ([], [], "identical"),
        ([9, 6, 7], [5, 6, 7], "diverged at token 0"),
        ([1, 2, 9, 4], [1, 2, 3, 4], "diverged at token 2"),
        ([1, 2], [1, 2, 3], "diverged at token 2"),
        ([1, 2, 3, 4], [1, 2, 3], "diverged at token 3"),
        ([], [5], "diverged at token 0"),
    ],
)
def test_compare_to_reference(ids, ref, expected):
    assert compare_to_reference(ids, ref) == expected


# ------------------------------------------------------------------------------------ records


def test_record_json_round_trip_and_derived_values():
    rec = make_record(route="chain", accepted=[4, 2, 1], decode_s=0.5)
    back = DecodeRecord.from_json(rec.to_json())
    assert back == rec
    assert "\n" not in rec.to_json()
    assert back.key == ("chain", "gsm8k", "p0", 0)
    assert back.tokens_per_s == pytest.approx(8 / 0.5)
    assert back.mean_accepted_length == pytest.approx(7 / 3)
    assert not back.is_ar and make_record().is_ar


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"output_sha256": "0" * 64}, "output_sha256"),
        ({"accepted_lengths": [2, 1, 1]}, "new_tokens - 1"),
        ({"finish_reason": "eos"}, "finish_reason"),
        ({"vs_ar": "same"}, "vs_ar"),
        ({"tree_sizes": [1]}, "tree_sizes"),
        ({"stage_s": {"draft": 0.0, "verify": 0.0, "commit": 0.0}}, "tree"),
    ],
)
def test_inconsistent_record_is_rejected(change, message):
    d = {**make_record().to_dict(), **change}
    with pytest.raises(ValueError, match=message):
        DecodeRecord.from_dict(d)


def test_missing_field_is_rejected():
    d = make_record().to_dict()
    del d["steps"]
    with pytest.raises(ValueError, match="steps"):
        DecodeRecord.from_dict(d)


# ----------------------------------------------------------------------------------- run dirs


def test_new_run_dir_writes_manifest(tmp_path: Path):
    run = RunDir(tmp_path / "run", {"config": CONFIG}, DECODE_KIND)
    assert not run.resumed
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert m["config"] == CONFIG
    assert m["config_hash"] == hashlib.sha256(canonical_json(CONFIG).encode()).hexdigest()
    assert m["config_hash"] == config_hash(CONFIG)
    assert m["seed"] == 7
    assert m["versions"]["python"]
    assert "pandas" in m["versions"]
    assert "triton" in m["versions"]  # the kernel libraries a run's kernels come from (fla when installed)
    assert m["device"]
    assert m["git_sha"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}(-dirty-[0-9a-f]{12})?", m["git_sha"])
    assert not list((tmp_path / "run").glob(".*.tmp"))


def test_config_hash_ignores_key_order_but_not_values():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1, "b": [1, 2]}) != config_hash({"a": 1, "b": [2, 1]})


def test_append_get_and_resume(tmp_path: Path):
    run = RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    a, b = make_record(prompt_id="p0"), make_record(route="chain", prompt_id="p0", accepted=[3])
    run.append(a)
    run.append(b)
    created = run.manifest["created_at"]
    run.close()
    again = RunDir(tmp_path, {"config": dict(CONFIG)}, DECODE_KIND)
    assert again.resumed
    assert again.done_keys() == {a.key, b.key}
    assert again.get("chain", "gsm8k", "p0", 0) == b
    assert again.get("chain", "gsm8k", "p1", 0) is None
    assert again.records() == [a, b]
    assert again.manifest["created_at"] == created
    assert len(again.manifest["resumes"]) == 1


def test_append_refuses_a_duplicate_key(tmp_path: Path):
    run = RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    run.append(make_record())
    with pytest.raises(ValueError, match="already"):
        run.append(make_record())
    assert len((tmp_path / "records.jsonl").read_text().splitlines()) == 1


def test_append_fsyncs_each_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    run = RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    synced: list[int] = []  # inodes of the files fsynced
    real_fsync = os.fsync
    monkeypatch.setattr(
        "repro.reporting.rundir.os.fsync", lambda fd: (synced.append(os.fstat(fd).st_ino), real_fsync(fd))
    )
    run.append(make_record(prompt_id="p0"))
    run.append(make_record(prompt_id="p1"))
    assert synced.count((tmp_path / "records.jsonl").stat().st_ino) == 2


def test_interrupted_run_loses_only_the_partial_line(tmp_path: Path):
    run = RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    recs = [make_record(prompt_id=f"p{i}") for i in range(3)]
    for r in recs:
        run.append(r)
    path = tmp_path / "records.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[:-20])  # killed in the middle of writing the third line
    run.close()

    with pytest.warns(RecordsWarning, match="truncated"):
        resumed = RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    assert resumed.done_keys() == {recs[0].key, recs[1].key}
    resumed.append(recs[2])
    resumed.append(make_record(prompt_id="p3"))

    text = path.read_text()
    assert text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) == 4
    assert [DecodeRecord.from_json(line).prompt_id for line in lines] == ["p0", "p1", "p2", "p3"]
    _, loaded = load_records(tmp_path)
    assert [r.key for r in loaded] == [r.key for r in recs] + [make_record(prompt_id="p3").key]


def test_load_records_ignores_truncated_last_line_with_warning(tmp_path: Path):
    run = RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    run.append(make_record(prompt_id="p0"))
    with open(tmp_path / "records.jsonl", "a") as f:
        f.write('{"route": "ar", "sui')
    with pytest.warns(RecordsWarning):
        _, recs = load_records(tmp_path)
    assert [r.prompt_id for r in recs] == ["p0"]


def test_different_config_is_refused_in_one_line(tmp_path: Path):
    out = tmp_path / "out"
    RunDir(out, {"config": CONFIG}, DECODE_KIND).append(make_record())
    before = (out / "records.jsonl").read_bytes()
    with pytest.raises(RunDirError) as exc:
        RunDir(out, {"config": {**CONFIG, "max_new_tokens": 64}}, DECODE_KIND)
    msg = str(exc.value)
    assert "\n" not in msg
    assert str(out) in msg
    assert "different configuration" in msg
    assert (out / "records.jsonl").read_bytes() == before


def test_different_seed_is_refused(tmp_path: Path):
    RunDir(tmp_path, {"config": CONFIG, "seed": 1}, DECODE_KIND)
    with pytest.raises(RunDirError, match="seed"):
        RunDir(tmp_path, {"config": CONFIG, "seed": 2}, DECODE_KIND)


def test_records_without_manifest_are_refused(tmp_path: Path):
    (tmp_path / "records.jsonl").write_text(make_record().to_json() + "\n")
    with pytest.raises(RunDirError, match="no manifest.json"):
        RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)


def test_load_records_errors_name_the_problem(tmp_path: Path):
    with pytest.raises(ReproError, match="does not exist"):
        load_records(tmp_path / "missing")
    with pytest.raises(ReproError, match="manifest.json"):
        load_records(tmp_path)
    run = RunDir(tmp_path, {"config": CONFIG}, DECODE_KIND)
    with pytest.raises(ReproError, match="records.jsonl"):
        load_records(tmp_path)
    run.append(make_record(prompt_id="p0"))
    run.append(make_record(prompt_id="p1"))
    path = tmp_path / "records.jsonl"
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + lines[1][:30] + "\n")
    with pytest.raises(ReproError, match=r"records\.jsonl line 2 is not a valid record"):
        load_records(tmp_path)
    path.write_text(lines[0] + "\n" + lines[0] + "\n")
    with pytest.raises(ReproError, match="line 2 repeats the record of line 1"):
        load_records(tmp_path)


def test_git_sha_of_a_checkout_and_of_a_plain_directory(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("REPRO_GIT_SHA", raising=False)  # the session's pin (conftest): git itself here
    assert git_sha(tmp_path) == "unknown"
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    try:
        git("init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not available")
    (repo / "a.txt").write_text("a")
    git("add", "a.txt")
    git("commit", "-q", "-m", "a")
    head = git("rev-parse", "HEAD")
    assert git_sha(repo) == head
    (repo / "results").mkdir()
    (repo / "results" / "records.jsonl").write_text("{}\n")  # a run's own output, untracked
    assert git_sha(repo) == head
    (repo / "a.txt").write_text("b")
    edit_b = git_sha(repo)
    assert re.fullmatch(rf"{head}-dirty-[0-9a-f]{{12}}", edit_b)
    (repo / "a.txt").write_text("c")  # another uncommitted edit is another code version
    assert git_sha(repo) not in (head, edit_b)
    (repo / "a.txt").write_text("b")
    assert git_sha(repo) == edit_b
    git("add", "a.txt")  # staged or not, the same edit
    assert git_sha(repo) == edit_b


def test_a_run_s_own_output_does_not_make_its_checkout_dirty():
    """The nightly script's default results root is ignored by git (it is output, not code)."""
    ignored = subprocess.run(
        ["git", "-C", str(Path(__file__).resolve().parents[2]), "check-ignore", "-q", "results/nightly/x"],
        check=False,
    )
    assert ignored.returncode == 0
