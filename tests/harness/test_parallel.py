"""Data parallelism over prompts: torchrun ranks and --shard jobs give the records of one process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from repro.errors import ReproError
from repro.harness.parallel import Shard, env_shard, expected_keys, merge_shards, parse_shard, shard_prompts
from repro.harness.run_kinds import KINDS
from repro.reporting.records import MANIFEST_FILE, RECORDS_FILE
from repro.reporting.rundir import load_records

ROOT = Path(__file__).resolve().parents[2]
# one code version for every process of the module (others may commit or edit the checkout meanwhile)
CODE = {"REPRO_GIT_SHA": "parallel-test"}
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **CODE}


@pytest.fixture(autouse=True)
def same_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process commands run as the same code as the module's subprocesses."""
    for key, value in CODE.items():
        monkeypatch.setenv(key, value)


SAME = ("output_sha256", "accepted_lengths", "tree_sizes", "new_tokens", "prompt_sha256", "vs_ar")


def repro(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "repro", *args], capture_output=True, text=True, cwd=ROOT, env=ENV
    )


def torchrun(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return subprocess.run(
        [*cmd, "-m", "repro", *args], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300
    )


def outcome(path: Path) -> dict[tuple, tuple]:
    """What must not depend on the split, per record key."""
    _, records = load_records(path)
    return {r.key: tuple(json.dumps(getattr(r, f)) for f in SAME) for r in records}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The tiny experiment run by one process, by two torchrun ranks and as two --shard jobs."""
    tmp = tmp_path_factory.mktemp("parallel")
    cfg = {
        "target": "default", "dtype": "float64", "suites": ["mt_bench", "gsm8k", "humaneval"], "limit": 1,
        "max_new_tokens": 8, "ignore_eos": True, "warmup": 0,
        "routes": [
            {"name": "ar", "kind": "ar"},
            {"name": "chain", "kind": "synthetic_chain", "k": 3, "p": 0.7},
            {"name": "dflash", "kind": "dflash_chain", "drafter": "tiny-qwen35-dflash"},
        ],
    }  # fmt: skip
    exp = tmp / "tiny.yaml"
    exp.write_text(yaml.safe_dump(cfg))
    paths = {"exp": exp, "one": tmp / "one", "dp": tmp / "dp", "jobs": tmp / "jobs"}
    res = repro("run", str(exp), "--out", str(paths["one"]))
    assert res.returncode == 0, res.stderr
    res = torchrun("run", str(exp), "--out", str(paths["dp"]))
    assert res.returncode == 0, res.stdout + res.stderr
    for i in (0, 1):
        res = repro("run", str(exp), "--out", str(paths["jobs"]), "--shard", f"{i}/2")
        assert res.returncode == 0, res.stderr
        assert not (paths["jobs"] / RECORDS_FILE).exists()  # a shard job writes only its shard
    return paths


def test_split_is_by_prompt_index():
    prompts = list(range(7))
    assert shard_prompts(prompts, Shard(1, 3)) == [1, 4]
    assert sorted(sum((shard_prompts(prompts, Shard(k, 3)) for k in range(3)), [])) == prompts
    assert parse_shard("2/4") == Shard(2, 4)
    for bad in ("4/4", "x", "1/0", "-1/2"):
        with pytest.raises(ReproError, match="--shard must be i/n"):
            parse_shard(bad)
    assert env_shard({}) is None
    assert env_shard({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == Shard(1, 2)


def test_torchrun_merge_equals_one_process(runs):
    one, dp = outcome(runs["one"]), outcome(runs["dp"])
    assert len(one) == 4 * 3  # mt_bench (2 turns), gsm8k, humaneval x 3 routes
    assert dp == one
    manifest, _ = load_records(runs["dp"])
    assert set(manifest["shards"]) == {"rank-0", "rank-1"}
    prov = manifest["shards"]
    assert [prov[r]["shard"] for r in ("rank-0", "rank-1")] == ["0/2", "1/2"]
    assert prov["rank-0"]["records"] + prov["rank-1"]["records"] == 12
    assert not set(prov["rank-0"]["prompts"]) & set(prov["rank-1"]["prompts"])
    assert all(prov[r]["host"] and prov[r]["device"] == "cpu" for r in prov)
    for rank in (0, 1):
        shard_manifest, records = load_records(runs["dp"] / "shards" / f"rank-{rank}")
        assert shard_manifest["shard"] == f"{rank}/2"
        assert shard_manifest["config_hash"] == manifest["config_hash"]
        assert {r.key for r in records} == expected_keys(manifest["config"], Shard(rank, 2))
    assert (runs["dp"] / "report.md").exists()


def test_shard_jobs_and_merge_equal_one_process(runs, tmp_path, monkeypatch, capsys):
    """The shard jobs' merge, and the refusals, through repro.cli.main in this process (the runs
    themselves are whole processes: the ``runs`` fixture)."""
    jobs = tmp_path / "jobs"
    shutil.copytree(runs["jobs"], jobs)
    # one shard only: refused, then merged with --partial, then completed by a second merge
    shutil.move(jobs / "shards" / "rank-1", tmp_path / "rank-1")
    code, _, err = run_cli(monkeypatch, capsys, "merge", str(jobs))
    assert code == 2 and "lacks shard(s) 1/2" in err
    assert len(err.splitlines()) == 1
    code, _, err = run_cli(monkeypatch, capsys, "merge", str(jobs), "--partial")
    assert code == 0, err
    assert len(outcome(jobs)) < 12
    shutil.move(tmp_path / "rank-1", jobs / "shards" / "rank-1")
    code, _, err = run_cli(monkeypatch, capsys, "merge", str(jobs))
    assert code == 0, err
    assert outcome(jobs) == outcome(runs["one"])
    # a shard directory of another split is not resumed; bad --shard values and --shard under torchrun
    code, _, err = run_cli(monkeypatch, capsys, "run", str(runs["exp"]), "--out", str(jobs), "--shard", "1/3")
    assert code == 2 and "rank-0 holds shard 0/2 of a run, not a shard of a 3-way split" in err
    assert "resumes" not in json.loads((jobs / "shards" / "rank-1" / MANIFEST_FILE).read_text())
    code, _, err = run_cli(monkeypatch, capsys, "run", str(runs["exp"]), "--out", str(jobs), "--shard", "2/2")
    assert code == 2 and err == "error: --shard must be i/n with 0 <= i < n (e.g. 0/4), got '2/2'"
    # merging again adds nothing and changes nothing
    before = (jobs / RECORDS_FILE).read_bytes()
    merged = merge_shards(jobs, KINDS)
    assert (merged.appended, merged.present) == (0, 12)
    assert (jobs / RECORDS_FILE).read_bytes() == before


def shards_copy(runs: dict[str, Path], tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(runs["jobs"] / "shards", out / "shards")
    return out


def edit_manifest(path: Path, **entries) -> None:
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    (path / MANIFEST_FILE).write_text(json.dumps({**manifest, **entries}))


def test_merge_refuses_another_config(runs, tmp_path):
    out = shards_copy(runs, tmp_path)
    other_config(out / "shards" / "rank-1")
    with pytest.raises(ReproError, match="rank-1 has another config hash"):
        merge_shards(out, KINDS)
    edit_manifest(out / "shards" / "rank-1", config_hash="0" * 64)  # a hash edited by hand
    with pytest.raises(ReproError, match="rank-1 has a manifest.json whose config_hash 000000000000 is not"):
        merge_shards(out, KINDS)
    assert not (out / RECORDS_FILE).exists()


def test_merge_infers_a_missing_kind(runs, tmp_path):
    """A shard manifest without 'kind' (older manifests) is of the kind its config says, not a KeyError."""
    out = shards_copy(runs, tmp_path)
    manifest = json.loads((out / "shards" / "rank-1" / MANIFEST_FILE).read_text())
    del manifest["kind"]
    (out / "shards" / "rank-1" / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert len(merge_shards(out, KINDS).records) == 12


def test_merge_refuses_a_duplicate_record(runs, tmp_path):
    out = shards_copy(runs, tmp_path)
    first = (out / "shards" / "rank-0" / RECORDS_FILE).read_text().splitlines()[0]
    with open(out / "shards" / "rank-1" / RECORDS_FILE, "a") as f:
        f.write(first + "\n")
    with pytest.raises(ReproError, match="is in shards rank-0 and rank-1; not merged"):
        merge_shards(out, KINDS)
    assert not (out / RECORDS_FILE).exists()


def test_merge_refuses_a_record_of_another_shard_and_an_interrupted_shard(runs, tmp_path):
    out = shards_copy(runs, tmp_path)
    lines = (out / "shards" / "rank-0" / RECORDS_FILE).read_text().splitlines(keepends=True)
    (out / "shards" / "rank-0" / RECORDS_FILE).write_text("".join(lines[:-1]))
    with pytest.raises(ReproError, match=r"holds \d+ of its \d+ records \(interrupted\)"):
        merge_shards(out, KINDS)
    (out / "shards" / "rank-1" / RECORDS_FILE).write_text(
        (out / "shards" / "rank-1" / RECORDS_FILE).read_text() + lines[-1]
    )
    with pytest.raises(
        ReproError, match="does not belong to shard 1/2 of this run .* is not one of this run's"
    ):
        merge_shards(out, KINDS)


def test_merge_refuses_a_record_of_other_route_params(runs, tmp_path):
    """Shards whose records resolve a route differently (another configuration's, edited) are not merged."""
    out = shards_copy(runs, tmp_path)
    path = out / "shards" / "rank-1" / RECORDS_FILE
    records = [json.loads(line) for line in path.read_text().splitlines()]
    next(r for r in records if r["route"] == "chain")["route_params"]["p"] = 0.9
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ReproError, match=r"rank-1 does not belong .*route 'chain' has route_params"):
        merge_shards(out, KINDS)
    assert not (out / RECORDS_FILE).exists()


def test_merge_refuses_a_shard_relabelled_or_missing(runs, tmp_path):
    out = shards_copy(runs, tmp_path)
    edit_manifest(out / "shards" / "rank-1", shard="1/3")
    with pytest.raises(ReproError, match=r"come from different splits \(/2, /3\)"):
        merge_shards(out, KINDS)
    with pytest.raises(ReproError, match="the run directory .* does not exist"):
        merge_shards(tmp_path / "nothing", KINDS)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReproError, match="has no shards"):
        merge_shards(tmp_path / "empty", KINDS)


def test_killed_rank_resumes_and_merges_identically(runs, tmp_path):
    """A rank killed mid-run (its records cut, a partial last line, no merge yet) resumes on rerun."""
    dp = tmp_path / "dp"
    shutil.copytree(runs["dp"] / "shards", dp / "shards")
    shard = dp / "shards" / "rank-1" / RECORDS_FILE
    lines = shard.read_bytes().splitlines(keepends=True)
    shard.write_bytes(lines[0] + lines[1][:20])
    res = torchrun("run", str(runs["exp"]), "--out", str(dp))
    assert res.returncode == 0, res.stdout + res.stderr
    assert outcome(dp) == outcome(runs["one"])
    assert shard.read_bytes().startswith(lines[0])
    manifest, _ = load_records(dp / "shards" / "rank-1")
    assert manifest["resumes"]
    rank0 = (dp / "shards" / "rank-0" / RECORDS_FILE).read_bytes()
    assert rank0 == (runs["dp"] / "shards" / "rank-0" / RECORDS_FILE).read_bytes()  # nothing redone


def test_merge_exits_3_when_a_merged_route_diverged(runs, tmp_path, capsys):
    from repro.cli import main

    out = shards_copy(runs, tmp_path)
    path = out / "shards" / "rank-1" / RECORDS_FILE
    records = [json.loads(line) for line in path.read_text().splitlines()]
    chain = next(r for r in records if r["route"] == "chain")
    chain["vs_ar"] = "diverged at token 2"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(SystemExit) as exc:
        main(["merge", str(out)])
    assert exc.value.code == 3
    assert "not lossless: route(s) chain diverged" in capsys.readouterr().err
    assert len(outcome(out)) == 12  # the records are merged all the same


def other_config(run: Path) -> None:
    """Make the run directory ``run`` one of another configuration (its hash recomputed)."""
    from repro.reporting.rundir import run_hash

    manifest = json.loads((run / MANIFEST_FILE).read_text())
    manifest["config"]["max_new_tokens"] = 9
    edit_manifest(run, config=manifest["config"], config_hash=run_hash(manifest))


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_another_split_is_refused_before_a_stray_shard_is_written(runs, tmp_path, monkeypatch, capsys):
    """A shard of another split (rank 2 of 3 beside a 2-way run's shards) is refused before it writes
    anything, so the right command still completes and merges."""
    jobs = tmp_path / "jobs"
    shutil.copytree(runs["jobs"] / "shards", jobs / "shards")
    shutil.rmtree(jobs / "shards" / "rank-1")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(runs["exp"]), "--out", str(jobs), "--shard", "2/3")
    assert code == 2 and len(err.splitlines()) == 1
    assert "rank-0 holds shard 0/2 of a run, not a shard of a 3-way split" in err
    assert sorted(p.name for p in (jobs / "shards").iterdir()) == ["rank-0"]
    code, _, err = run_cli(monkeypatch, capsys, "run", str(runs["exp"]), "--out", str(jobs), "--shard", "1/2")
    assert code == 0, err
    assert len(merge_shards(jobs, KINDS).records) == 12


def test_shards_are_written_only_into_runs_of_their_configuration(runs, tmp_path, monkeypatch, capsys):
    """--shard refuses a non-empty folder that is not a run, and a run or shards of another configuration;
    a plain run refuses a folder holding another configuration's shards; each leaves it untouched."""
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    other = tmp_path / "other"
    shutil.copytree(runs["one"], other)
    other_config(other)
    other_shards = tmp_path / "other_shards"
    shutil.copytree(runs["jobs"] / "shards", other_shards / "shards")
    other_config(other_shards / "shards" / "rank-1")
    cases = [
        (foreign, ("--shard", "0/2"), "is not empty (notes.txt)"),
        (other, ("--shard", "0/2"), "holds a run of a different configuration"),
        (other_shards, ("--shard", "0/2"), "rank-1 holds a run of a different configuration"),
        (other_shards, (), "rank-1 holds a run of a different configuration"),
    ]
    for out, args, match in cases:
        before = snapshot(out)
        code, _, err = run_cli(monkeypatch, capsys, "run", str(runs["exp"]), "--out", str(out), *args)
        assert code == 2 and len(err.splitlines()) == 1 and match in err, (out, args, err)
        assert snapshot(out) == before, (out, args)


def test_a_shard_decoded_again_after_a_merge_is_refused_before_writing(runs, tmp_path):
    """A shard record that differs from the one the merged run holds is refused, the merged run untouched."""
    out = shards_copy(runs, tmp_path)
    merge_shards(out, KINDS)
    path = out / "shards" / "rank-1" / RECORDS_FILE
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[0]["decode_s"] += 1.0
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    before = snapshot(out)
    with pytest.raises(ReproError, match=r"cannot be resumed: records.jsonl line \d+: record .* differs"):
        merge_shards(out, KINDS)
    assert snapshot(out) == before


def test_sampled_draws_are_the_prompt_s_own_whatever_the_split_order_or_resume(tmp_path, monkeypatch, capsys):
    """At temperature 1 (sample_match, spec_sampling with sampled drafts, traversal) a prompt's records do not
    depend on what ran before it: the one-process run equals its shards merged, a run of another suite
    order and route set (its shared records), and a resume cut in the middle of an MT-Bench prompt."""
    cfg = {
        "target": "default", "dtype": "float64", "suites": ["mt_bench", "gsm8k"], "limit": 1,
        "max_new_tokens": 6, "temperature": 1.0, "acceptance": "sample_match", "ignore_eos": True,
        "warmup": 0,
        "routes": [
            {"name": "ar", "kind": "ar"},
            {"name": "chain", "kind": "synthetic_chain", "k": 3, "p": 0.7},
            {"name": "ddtree", "kind": "ddtree", "budget": 6, "draft": "sample",
             "acceptance": "spec_sampling"},
            {"name": "tfm", "kind": "dflash_tfm", "budget": 6, "acceptance": "traversal"},
        ],
    }  # fmt: skip
    exp, other = tmp_path / "hot.yaml", tmp_path / "other.yaml"
    exp.write_text(yaml.safe_dump(cfg))
    routes = [cfg["routes"][3], cfg["routes"][0], cfg["routes"][2]]  # no chain; tfm before AR
    other.write_text(yaml.safe_dump({**cfg, "suites": ["gsm8k", "mt_bench"], "routes": routes}))

    def run(path: Path, *args: str, out: Path) -> dict[tuple, tuple]:
        code, _, err = run_cli(monkeypatch, capsys, "run", str(path), "--out", str(out), *args)
        assert code == 0, err
        return outcome(out) if (out / RECORDS_FILE).exists() else {}

    one = run(exp, out=tmp_path / "one")
    assert len(one) == 3 * 4
    for rank in (0, 1):
        run(exp, "--shard", f"{rank}/2", out=tmp_path / "jobs")
    code, _, err = run_cli(monkeypatch, capsys, "merge", str(tmp_path / "jobs"))
    assert code == 0, err
    assert outcome(tmp_path / "jobs") == one
    # another suite order and route set: the records they share are the same draws (vs_ar aside: tfm
    # decodes before its AR reference)
    others = run(other, out=tmp_path / "other")
    assert {k: v[:-1] for k, v in others.items()} == {k: one[k][:-1] for k in others}
    # interrupted after MT-Bench's first turn and in the middle of a second-turn record, then resumed
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "one", resumed)
    lines = (resumed / RECORDS_FILE).read_bytes().splitlines(keepends=True)
    (resumed / RECORDS_FILE).write_bytes(b"".join(lines[:5]) + lines[5][:30])
    assert run(exp, out=resumed) == one
