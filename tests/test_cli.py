"""The CLI end to end: the smoke experiment, resume, reports, generate, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from repro.reporting.rundir import load_records

ROOT = Path(__file__).resolve().parent.parent


def repro(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "repro", *args], capture_output=True, text=True, cwd=cwd or ROOT, env=full_env
    )


def tiny_experiment(tmp_path: Path, **extra) -> Path:
    cfg = {
        "target": "default",
        "dtype": "float64",
        "suites": ["mt_bench", "gsm8k", "humaneval"],
        "limit": 1,
        "max_new_tokens": 12,
        "ignore_eos": True,
        "warmup": 0,
        "routes": [
            {"name": "ar", "kind": "ar"},
            {"name": "chain", "kind": "synthetic_chain", "k": 3, "p": 0.7},
            {"name": "tree", "kind": "synthetic_tree", "k": 3, "p": 0.5, "width": 3},
        ],
        **extra,
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """``repro run`` of :func:`tiny_experiment` once for the module, as a whole process (the experiment
    file, the run directory, the process); tests that change the directory take a copy (:func:`copy_run`)."""
    tmp = tmp_path_factory.mktemp("tiny")
    exp = tiny_experiment(tmp)
    res = repro("run", str(exp), "--out", str(tmp / "run"))
    assert res.returncode == 0, res.stderr
    return exp, tmp / "run", res


def copy_run(run: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(run, tmp_path / "run"))


def test_run_writes_records_report_and_resumes(tmp_path, tiny_run, monkeypatch, capsys):
    exp, first, res = tiny_run
    manifest, records = load_records(first)
    # 1 prompt x (2 turns MT-Bench + 1 + 1) x 3 routes
    assert len(records) == 4 * 3
    assert {r.vs_ar for r in records if r.route != "ar"} == {"identical"}
    assert {(r.suite, r.turn) for r in records} == {
        ("mt_bench", 0),
        ("mt_bench", 1),
        ("gsm8k", 0),
        ("humaneval", 0),
    }
    assert manifest["config"]["max_new_tokens"] == 12
    assert "chain" in res.stdout and "tree" in res.stdout
    assert "tiny: 12/12 (100%), elapsed" in res.stderr  # progress is logged without a terminal
    assert "tiny: 3 route(s) built in" in res.stderr
    assert (first / "report.md").exists() and (first / "summary.csv").exists()
    # simulate an interruption: drop the last 5 records and cut the next one mid-line (in a copy; the
    # resume and the report run in this process)
    out = copy_run(first, tmp_path)
    lines = (out / "records.jsonl").read_text().splitlines()
    (out / "records.jsonl").write_text("\n".join(lines[:6]) + "\n" + lines[6][:40])
    code, _, err = run_cli(monkeypatch, capsys, "run", str(exp), "--out", str(out))
    assert code == 0, err
    _, resumed = load_records(out)
    assert len(resumed) == 12
    assert [r.output_sha256 for r in resumed[:6]] == [r.output_sha256 for r in records[:6]]
    assert sorted(r.key for r in resumed) == sorted(r.key for r in records)
    same = ("output_sha256", "accepted_lengths", "tree_sizes", "vs_ar")  # redone as uninterrupted
    assert {r.key: [getattr(r, f) for f in same] for r in resumed} == {
        r.key: [getattr(r, f) for f in same] for r in records
    }

    # the report rebuilds from records alone: every file byte for byte as the run wrote it (figures,
    # tables, report.md, the manifest)
    def files() -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and p.name != ".lock"}

    written = files()
    assert {"report.md", "summary.csv", "acceptance.png"} <= set(written)
    code, stdout, _ = run_cli(monkeypatch, capsys, "report", str(out))
    assert code == 0 and "chain" in stdout
    assert files() == written


def test_run_refuses_a_directory_of_another_config(tmp_path, tiny_run, monkeypatch, capsys):
    exp, first, _ = tiny_run
    out = copy_run(first, tmp_path)
    before = (out / "records.jsonl").read_text()
    code, _, err = run_cli(monkeypatch, capsys, "run", str(exp), "--out", str(out), "--max-new-tokens", "5")
    assert code == 2
    assert "different configuration" in err and len(err.strip().splitlines()) == 1
    assert (out / "records.jsonl").read_text() == before


# the cases in SUBPROCESS run as `python -m repro` (a ReproError of run and of generate, a Click usage
# error: the whole process prints one line, nothing at import); the rest call repro.cli.main in this
# process (the same code after the imports, without ~4 s of imports a case)
SUBPROCESS = {
    ("run", "no-such-experiment"),
    ("generate", "--prompt-ids", "1,2,x"),
    ("run", "smoke", "--limit", "abc"),
}
BAD_INPUT = [
    (["run", "no-such-experiment"], "unknown experiment"),
    (["run", "smoke", "--suites", "gsm9k"], "unknown suite"),
    (["run", "smoke", "--target", "/nonexistent/ckpt"], "does not exist"),
    (["generate", "hi", "--route", "warp"], "unknown route kind"),
    (["generate", "--prompt-ids", "1,2,x"], "plain decimal integers"),
    (["generate", "--prompt-ids", "1_0"], "plain decimal integers"),  # int() would read 10
    (["generate", "--prompt-ids", "1,,2"], "plain decimal integers"),
    (["generate", "--prompt-ids", "-1"], "plain decimal integers"),
    (["generate", "hi", "--route", "synthetic_chain", "--param", "k=3"], "missing parameter"),
    (["run", "smoke", "--device", "tpu"], "unknown device"),
    (["generate", "hi", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "hi", "--max-new-tokens", "-5"], "--max-new-tokens"),
    (["generate", "hi", "--max-new-tokens", "1000001"], "--max-new-tokens must be in [1, 1,000,000]"),
    (["generate", "hi", "--temperature", "-1"], "temperature must be a finite number >= 0"),
    (["generate", "hi", "--temperature", "nan"], "temperature must be a finite number >= 0"),
    (["run", "smoke", "--temperature", "nan"], "temperature must be a finite number >= 0"),
    (["run", "smoke", "--max-new-tokens", "1000001"], "max_new_tokens must be in [1, 1,000,000]"),
    (["run", "smoke", "--commit", "later"], "unknown commit strategy"),
    (["run", "smoke", "--limit", "abc"], "Invalid value for '--limit'"),  # Click's usage errors
    (["run", "smoke", "--no-such-option"], "No such option"),
    (["run", "smoke", "--dtype", "fp32"], "Invalid value for '--dtype'"),
    (["bench", "model", "--shape", "tiny"], "No such option: --shape"),
    (["train", "target", "--precision", "bf16"], "No such option: --precision"),
]
assert {tuple(args) for args, _ in BAD_INPUT} > SUBPROCESS


@pytest.mark.parametrize("args, needle", BAD_INPUT)
def test_bad_input_gives_one_line_errors(tmp_path, monkeypatch, capsys, args, needle):
    full = [*args, "--out", str(tmp_path / "o")] if args[0] == "run" else args
    if tuple(args) in SUBPROCESS:
        res = repro(*full)
        code, stdout, stderr = res.returncode, res.stdout, res.stderr
    else:
        code, stdout, stderr = run_cli(monkeypatch, capsys, *full)
    assert code == 2, stdout + stderr
    assert needle in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "Traceback" not in stderr


def test_bad_experiment_files(tmp_path, monkeypatch, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text("routes: [unclosed\n")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(broken))
    assert code == 2 and "not valid YAML" in err
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("speed: 11\n")
    code, _, err = run_cli(monkeypatch, capsys, "run", str(unknown))
    assert code == 2 and "unknown experiment setting" in err


def test_corrupted_suite_file_is_refused(tmp_path, monkeypatch, capsys):
    suites = tmp_path / "suites"
    suites.mkdir()
    for f in (ROOT / "suites").iterdir():
        (suites / f.name).write_bytes(f.read_bytes())
    data = bytearray((suites / "gsm8k.jsonl").read_bytes())
    data[100] ^= 1
    (suites / "gsm8k.jsonl").write_bytes(bytes(data))
    exp = tiny_experiment(tmp_path, suites=["gsm8k"])
    monkeypatch.setenv("REPRO_SUITES_DIR", str(suites))
    code, _, err = run_cli(monkeypatch, capsys, "run", str(exp), "--out", str(tmp_path / "o"))
    assert code == 2 and "corrupted" in err and "gsm8k" in err
    code, stdout, err = run_cli(monkeypatch, capsys, "suites", "verify")
    assert code == 3 and "BAD gsm8k: suite file" in stdout and "corrupted" in stdout  # a failed check
    assert "sha256 None" not in stdout and "ok  humaneval: 164 records, sha256 " in stdout
    assert f"do not match {suites / 'manifest.json'}" in err  # the manifest actually used


def test_generate_prints_json_and_matches_ar(monkeypatch, capsys):
    code, stdout, err = run_cli(
        monkeypatch, capsys, "generate", "Hello there", "--route", "synthetic_tree", "--param", "k=3",
        "--param", "p=0.6", "--param", "width=2", "--max-new-tokens", "10", "--dtype", "float64",
        "--ignore-eos",
    )  # fmt: skip
    assert code == 0, err
    out = json.loads(stdout)
    assert out["new_tokens"] == 10 and out["identical_to_ar"] is True
    assert sum(out["accepted_lengths"]) == 9 and set(out["stage_s"]) == {"draft", "tree", "verify", "commit"}
    code, stdout, _ = run_cli(
        monkeypatch, capsys, "generate", "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--ignore-eos"
    )
    assert code == 0 and json.loads(stdout)["prompt_ids"] == [1, 2, 3]


def test_generate_at_temperature_1_with_the_same_seed_prints_the_same_json_but_timings(monkeypatch, capsys):
    """Sampled drafts under spec_sampling (a step's draws for the drafts and the acceptance) and the AR
    reference: the same seed gives the same tokens, accepted lengths and verdict; another seed others."""
    args = ["generate", "Hello there", "--route", "ddtree", "--param", "budget=6", "--param", "draft=sample",
            "--param", "acceptance=spec_sampling", "--temperature", "1", "--max-new-tokens", "10",
            "--dtype", "float64", "--ignore-eos"]  # fmt: skip
    timings = ("prefill_s", "decode_s", "stage_s", "device_stage_s", "busy_stage_s")
    outs = []
    for seed in ("5", "5", "6"):
        code, stdout, err = run_cli(monkeypatch, capsys, *args, "--seed", seed)
        assert code == 0, err
        outs.append({k: v for k, v in json.loads(stdout).items() if k not in timings})
    assert outs[0] == outs[1]
    assert outs[0]["output_ids"] != outs[2]["output_ids"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """``repro export-default`` once for the module; tests that change it take a copy (:func:`copy_of`)."""
    ckpt = tmp_path_factory.mktemp("export") / "ckpt"
    res = repro("export-default", str(ckpt))
    assert res.returncode == 0, res.stderr
    return ckpt


def copy_of(ckpt: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(ckpt, tmp_path / "ckpt"))


def test_exported_default_loads_as_a_checkpoint(tmp_path, exported, monkeypatch, capsys):
    ckpt = copy_of(exported, tmp_path)
    args = ("generate", "abc", "--max-new-tokens", "8", "--ignore-eos")
    a = json.loads(run_cli(monkeypatch, capsys, *args, "--target", "tiny-random")[1])
    b = json.loads(run_cli(monkeypatch, capsys, *args, "--target", str(ckpt))[1])
    assert a["output_ids"] == b["output_ids"]
    (ckpt / "model.safetensors").unlink()
    code, _, err = run_cli(monkeypatch, capsys, "generate", "abc", "--target", str(ckpt))
    assert code == 2 and "no *.safetensors" in err


def test_shipped_smoke_routes_all_reproduce_ar(tmp_path):
    """The shipped smoke experiment (fewer tokens) on the trained family: every route, with the
    shipped DFlash, EAGLE and Weaver drafters, identical to AR on all suites; trained drafters
    accept more than one token per step."""
    from repro.harness.experiment import load_experiment
    from repro.harness.runner import ExperimentRunner
    from repro.reporting.records import build_manifest
    from repro.reporting.report import DECODE_KIND
    from repro.reporting.rundir import RunDir

    cfg = load_experiment("smoke", {"limit": 1, "max_new_tokens": 12})  # MAL 1.9 .. 3.0 of the drafters
    cfg["warmup"], cfg["ignore_eos"] = 0, True
    runner = ExperimentRunner(cfg)
    run_dir = RunDir(tmp_path / "smoke", build_manifest(cfg), DECODE_KIND)
    assert runner.run(run_dir) == 4 * len(cfg["routes"])
    records = run_dir.records()
    assert {r.suite for r in records} == {"mt_bench", "gsm8k", "humaneval"}
    kinds = {r.route_params["kind"] for r in records}
    drafted = {"dflash_chain", "ddtree", "eagle_chain", "eagle_tree", "weaver", "specla", "fla_sd"}
    assert kinds == {"ar", "synthetic_chain", "synthetic_tree"} | drafted
    assert {r.route_params.get("commit") for r in records} >= {"replay", "snapshot"}
    for r in records:
        assert r.vs_ar == ("reference" if r.route == "ar" else "identical"), (r.route, r.suite, r.vs_ar)
        assert r.new_tokens == 12
    for kind in drafted:
        steps = [r for r in records if r.route_params["kind"] == kind]
        assert sum(r.new_tokens for r in steps) / sum(len(r.accepted_lengths) for r in steps) > 1.5, kind


def test_the_progress_line_names_a_turn_as_the_records_and_reports_do(tmp_path, monkeypatch, capsys):
    """MT-Bench's second turn is turn 1 in records and reports ("turn 1"): the progress line too."""
    only_ar = "routes=[{name: ar, kind: ar}]"
    args = ("run", "smoke", "--suites", "mt_bench", "--limit", "1", "--max-new-tokens", "3", "--set", only_ar)
    code, _, err = run_cli(monkeypatch, capsys, *args, "--out", str(tmp_path / "run"))
    last = json.loads((tmp_path / "run" / "records.jsonl").read_text().splitlines()[-1])
    assert code == 0 and last["turn"] == 1
    assert f"mt_bench/{last['prompt_id']} turn 1 ar" in err, err


def test_acceptance_experiment_writes_table_and_figure(tmp_path, monkeypatch, capsys):
    out = tmp_path / "acc"
    args = ("run", "acceptance", "--suites", "gsm8k", "--limit", "1", "--max-new-tokens", "12")
    code, stdout, err = run_cli(monkeypatch, capsys, *args, "--out", str(out))
    assert code == 0, err
    assert "Break-even acceptance probability" in stdout and "0.7" in stdout  # the paper's, beside
    assert (out / "figures" / "acceptance.png").stat().st_size > 1000
    assert (out / "figures" / "acceptance.svg").exists()
    import pandas as pd

    assert json.loads((out / "manifest.json").read_text())["kind"] == "paper-acceptance"
    assert list(pd.read_csv(out / "break_even.csv")["k"]) == [2, 4, 8]
    table = pd.read_csv(out / "table.csv")
    assert sorted(set(table["k"])) == [2, 4, 8] and len(table) == 21
    full = table[(table["p"] == 1.0) & (table["k"] == 2)]
    assert float(full["MAL"].iloc[0]) > 2.5  # 11 tokens after the first at 3 per step, last step cut


def test_a_folder_named_like_an_experiment_does_not_shadow_it(tmp_path, monkeypatch):
    from repro.harness.experiment import load_experiment

    (tmp_path / "smoke").mkdir()  # e.g. an earlier `--out smoke`
    monkeypatch.chdir(tmp_path)
    assert load_experiment("smoke")["name"] == "smoke"


def test_prompt_ids_accept_commas_and_spaces_and_need_no_tokenizer(tmp_path, exported, monkeypatch, capsys):
    args = ("generate", "--prompt-ids", " 1 2,3 ,4 ", "--max-new-tokens", "2", "--target", "tiny-random")
    code, stdout, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    assert json.loads(stdout)["prompt_ids"] == [1, 2, 3, 4]  # not [1234]
    ckpt = copy_of(exported, tmp_path)
    (ckpt / "repro_tokenizer.json").unlink()  # weights and config, no tokenizer files
    args = ("generate", "--prompt-ids", "1,2", "--max-new-tokens", "3", "--ignore-eos", "--target", str(ckpt))
    code, stdout, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    out = json.loads(stdout)
    assert out["text"] is None and out["new_tokens"] == 3
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", "--target", str(ckpt))
    assert code == 2 and "has no tokenizer" in err


def test_a_prompt_that_is_not_utf8_is_one_line():
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-m", "repro", "generate", b"caf\xe9"], capture_output=True, cwd=ROOT, env=env
    )
    stderr = res.stderr.decode()
    assert res.returncode == 2 and "not valid UTF-8" in stderr and len(stderr.strip().splitlines()) == 1


def test_help_lists_commands_and_documents_the_exit_codes(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    code, stdout, _ = run_cli(monkeypatch, capsys, "--help")
    assert code == 0
    for cmd in ("run", "generate", "report", "suites", "routes", "export-default"):
        assert cmd in stdout
    text = " ".join(stdout.split())
    assert "0 success" in text and "2 bad usage or input" in text and "3 a check failed" in text
    assert "130 interrupted" in text


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    from repro.cli import main

    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize("stop", ["KeyboardInterrupt", "Abort"])
def test_ctrl_c_prints_the_resume_message_and_exits_130(monkeypatch, capsys, stop):
    """Ctrl-C as Python raises it, and as Typer's Abort (a RuntimeError: not taken for another error)."""
    import typer

    import repro.harness.experiment as experiment

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt if stop == "KeyboardInterrupt" else typer.Abort()

    monkeypatch.setattr(experiment, "load_experiment", interrupted)
    code, err = run_main(monkeypatch, capsys, "run", "smoke")
    assert code == 130
    assert "interrupted: records written so far are kept; rerun the same command to resume" in err


@pytest.mark.parametrize("error", ["cuda", "host"])
def test_a_run_the_device_cannot_hold_is_one_line_and_exit_2(monkeypatch, capsys, error):
    """torch's CUDA out-of-memory error (and the host's MemoryError) is one line naming what was tried and
    what to do, not a traceback; any other error still raises."""
    import torch

    import repro.harness.experiment as experiment

    said = (
        "CUDA out of memory. Tried to allocate 340.00 MiB. GPU 0 has a total capacity of 79.18 GiB of which"
        " 72.19 MiB is free. Including non-PyTorch memory, this process has 79.10 GiB memory in use."
    )

    def full(*_args, **_kwargs):
        raise torch.OutOfMemoryError(said) if error == "cuda" else MemoryError()

    monkeypatch.setattr(experiment, "load_experiment", full)
    code, err = run_main(monkeypatch, capsys, "run", "smoke")
    assert code == 2 and len(err.strip().splitlines()) == 1
    if error == "cuda":
        assert "out of memory: CUDA out of memory. Tried to allocate 340.00 MiB" in err
        assert "72.19 MiB is free." in err and "Including" not in err
    assert "a larger card (the records written so far are kept)" in err

    def broken(*_args, **_kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(experiment, "load_experiment", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        run_main(monkeypatch, capsys, "run", "smoke")


def test_run_exits_3_when_a_route_diverges_where_it_must_not(tmp_path, monkeypatch, capsys):
    import repro.harness.runner as runner

    exp = tiny_experiment(tmp_path, suites=["gsm8k"], max_new_tokens=4)  # float64, greedy: lossless
    monkeypatch.setattr(runner, "compare_to_reference", lambda ids, ref: "diverged at token 1")
    code, err = run_main(monkeypatch, capsys, "run", str(exp), "--out", str(tmp_path / "a"))
    assert code == 3 and "not lossless: route(s) chain, tree diverged from AR in float64" in err
    assert (tmp_path / "a" / "report.md").exists()  # the records and report are still written
    # float32 is not exact: divergence is recorded, not a failure (unless the experiment sets lossless)
    code, _ = run_main(
        monkeypatch, capsys, "run", str(exp), "--out", str(tmp_path / "b"), "--dtype", "float32"
    )
    assert code == 0


def test_falsify_and_family_report_failures_exit_3(monkeypatch, capsys, tmp_path):
    from types import SimpleNamespace

    import repro.harness.falsify as falsify
    import repro.harness.family_report as family_report

    monkeypatch.setattr(falsify, "tree_exactness", lambda *a: [SimpleNamespace(verdict="fail")])
    monkeypatch.setattr(falsify, "write_exactness", lambda *a: "report")
    code, err = run_main(monkeypatch, capsys, "falsify", "tree-exactness", "--out", str(tmp_path / "f"))
    assert code == 3 and "tree exactness failed in 1 of 1 cases" in err
    monkeypatch.setattr(family_report, "run_family_report", lambda cfg, progress: ("report", ["ddtree"]))
    code, err = run_main(monkeypatch, capsys, "family", "report", "--out", str(tmp_path / "r"))
    assert code == 3 and "not lossless: 1 route(s) diverged" in err


@pytest.mark.parametrize(
    "args, says",
    [
        (("bench", "kernels", "--quick", "--warmup-ms", "-1"), "warm-up must be a finite number"),
        (("bench", "kernels", "--quick", "--rep-ms", "nan"), "repetitions must be a finite number"),
        (("bench", "kernels", "--quick", "--time-budget", "-1"), "--time-budget must be a finite number"),
        (("bench", "kernels", "--quick", "--bf16-precision", "foo"), "--bf16-precision must be"),
        (("bench", "model", "--shapes", "tiny", "--rep-ms", "-1"), "repetitions must be a finite number"),
        (("data", "corpus", "--max-mb", "nan"), "--max-mb must be a finite number > 0"),
    ],
)
def test_bad_numbers_are_one_line_and_exit_2(monkeypatch, capsys, tmp_path, args, says):
    code, _, err = run_cli(monkeypatch, capsys, *args, "--out", str(tmp_path / "out"))
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_unreadable_experiment_files_and_config_objects_are_one_line(monkeypatch, capsys, tmp_path):
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    binary = tmp_path / "bad.yaml"
    binary.write_bytes(b"\xff\xfe\x00name: x\n")
    for path, says in ((folder, "cannot read experiment file"), (binary, "is not UTF-8 text")):
        code, _, err = run_cli(monkeypatch, capsys, "run", str(path), "--check")
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    target = tmp_path / "junk"
    target.mkdir()
    (target / "config.json").write_text("[1, 2]")
    code, _, err = run_cli(monkeypatch, capsys, "run", "smoke", "--target", str(target), "--check")
    assert code == 2 and "does not hold a JSON object" in err, err
